"""The shipped reference files hold FireCaffe's Table 2 and 3, and a bad reference file is one sentence naming the
file, the line, the column, what was found and what is allowed."""
from __future__ import annotations

from pathlib import Path

import pytest

from firescale.errors import FirescaleError
from firescale.store.reference import (
    COLUMNS,
    REQUIRED,
    ReferenceRow,
    read_reference,
    reference_path,
    shipped_names,
    shipped_reference,
)

HEADER = ",".join(COLUMNS)
GOOD = 'nin,32 K20,Titan,FireCaffe,47,256,0.01,11,13,0.589,,"FireCaffe (Iandola et al., CVPR 2016), Table 2"'


def _row(rows: list[ReferenceRow], hardware: str, framework: str) -> ReferenceRow:
    (row,) = [r for r in rows if r.hardware == hardware and r.framework == framework]
    return row


def test_shipped_names_and_paths():
    assert shipped_names() == ("firecaffe-table2", "firecaffe-table3")
    path = shipped_reference("firecaffe-table2")
    assert path.is_file() and path.name == "firecaffe-table2.csv"
    assert shipped_reference("firecaffe-table3.csv") == reference_path("firecaffe-table3")
    assert path.read_text().splitlines()[0] == HEADER


def test_table2_holds_the_papers_figures():
    rows = read_reference(shipped_reference("firecaffe-table2"))
    assert len(rows) == 6
    assert all(r.source == "FireCaffe (Iandola et al., CVPR 2016), Table 2" for r in rows)
    assert all(r.top5 is None for r in rows)
    alexnet = [r for r in rows if r.net == "alexnet"][0]
    assert (alexnet.hardware, alexnet.framework, alexnet.site) == ("1 K20", "Caffe", "")
    assert (alexnet.epochs, alexnet.batch, alexnet.initial_lr) == (100, 256, 0.01)
    assert (alexnet.train_time_h, alexnet.speedup, alexnet.top1) == (6.0 * 24, 1, 0.589)
    nin_1 = [r for r in rows if r.net == "nin" and r.hardware == "1 K20"][0]
    assert (nin_1.epochs, nin_1.batch, nin_1.initial_lr, nin_1.train_time_h, nin_1.speedup, nin_1.top1) == (
        47, 256, 0.01, 139.2, 1, 0.589)
    assert nin_1.train_time_h == pytest.approx(5.8 * 24)
    convnet2 = _row(rows, "8 K20", "cuda-convnet2")
    assert (convnet2.net, convnet2.site, convnet2.batch) == ("alexnet", "", None)  # the paper: batch "varies"
    assert (convnet2.epochs, convnet2.initial_lr, convnet2.train_time_h, convnet2.speedup, convnet2.top1) == (
        100, 0.02, 16, 7.7, 0.571)
    nin_32 = _row(rows, "32 K20", "FireCaffe")
    assert (nin_32.net, nin_32.site, nin_32.gpus, nin_32.batch, nin_32.initial_lr) == ("nin", "Titan", 32, 256, 0.01)
    assert (nin_32.train_time_h, nin_32.speedup, nin_32.top1) == (11, 13, 0.589)
    big_32 = _row(rows, "32 K20", "FireCaffe-batch1024")
    assert (big_32.batch, big_32.initial_lr, big_32.train_time_h, big_32.speedup, big_32.top1) == (
        1024, 0.04, 6, 23, 0.586)
    big_128 = _row(rows, "128 K20", "FireCaffe-batch1024")
    assert (big_128.gpus, big_128.epochs, big_128.train_time_h, big_128.speedup, big_128.top1) == (
        128, 47, 3.6, 39, 0.586)


def test_table3_holds_the_papers_figures():
    rows = read_reference(reference_path("firecaffe-table3"))
    assert [r.gpus for r in rows] == [1, 32, 128]
    assert all(r.net == "googlenet" and r.top1 == 0.683 and r.top5 == 0.887 for r in rows)
    assert all(r.source == "FireCaffe (Iandola et al., CVPR 2016), Table 3" for r in rows)
    one, thirty_two, one_twenty_eight = rows
    assert (one.framework, one.site, one.epochs, one.batch, one.initial_lr) == ("Caffe", "", 64, 32, 0.01)
    assert (one.train_time_h, one.speedup) == (21 * 24, 1)
    for row, hours, speedup in ((thirty_two, 23.4, 20), (one_twenty_eight, 10.5, 47)):
        assert (row.framework, row.site, row.epochs, row.batch, row.initial_lr) == ("FireCaffe", "Titan", 72, 1024,
                                                                                    0.08)
        assert (row.train_time_h, row.speedup) == (hours, speedup)


def test_optional_columns_may_be_left_out_and_cells_are_stripped(tmp_path: Path):
    path = tmp_path / "mine.csv"
    path.write_text(" net , hardware ,train_time_h\n  resnet50 ,  8 V100 , 2.5 \n\n")
    (row,) = read_reference(path)
    assert row == ReferenceRow("resnet50", "8 V100", "", "", None, None, None, 2.5, None, None, None, "")
    assert row.gpus == 8
    assert reference_path(str(path)) == path


def _error(tmp_path: Path, content: str | bytes) -> str:
    path = tmp_path / "ref.csv"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(FirescaleError) as info:
        read_reference(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


def test_unknown_column_suggests_the_nearest(tmp_path: Path):
    message = _error(tmp_path, HEADER.replace("top1", "top_1") + "\n" + GOOD + "\n")
    assert "line 1" in message and "unknown column 'top_1'" in message and "did you mean 'top1'" in message
    assert "allowed: net, hardware" in message


def test_missing_required_column(tmp_path: Path):
    message = _error(tmp_path, "net,hardware,speedup\nnin,32 K20,13\n")
    assert "line 1" in message and "missing required column 'train_time_h'" in message
    assert "required: " + ", ".join(REQUIRED) in message


@pytest.mark.parametrize("cell", ["12,5", "fast", "nan", "11h"])
def test_a_cell_that_is_not_a_number(tmp_path: Path, cell: str):
    line = GOOD.replace(",11,13,", f',"{cell}",13,')
    message = _error(tmp_path, f"{HEADER}\n{GOOD}\n{line}\n")
    assert "line 3" in message and "column 'train_time_h'" in message and repr(cell) in message
    assert "number" in message and "hours" in message and "such as 139.2" in message


def test_batch_must_be_whole(tmp_path: Path):
    message = _error(tmp_path, f"{HEADER}\n{GOOD.replace(',256,', ',varies,')}\n")
    assert "line 2, column 'batch': 'varies' is not a whole number" in message and "empty where" in message


@pytest.mark.parametrize("cell", ["58.9", "-0.1", "1.5"])
def test_top1_outside_0_to_1(tmp_path: Path, cell: str):
    message = _error(tmp_path, f"{HEADER}\n{GOOD.replace(',0.589,', f',{cell},')}\n")
    assert "line 2, column 'top1'" in message and repr(cell) in message and "outside 0..1" in message
    assert "as a fraction, 0.589 for 58.9%" in message


def test_top1_as_a_percentage(tmp_path: Path):
    message = _error(tmp_path, f"{HEADER}\n{GOOD.replace(',0.589,', ',58.9%,')}\n")
    assert "column 'top1': '58.9%' is not a number" in message and "as a fraction, 0.589 for 58.9%" in message


def test_negative_time(tmp_path: Path):
    message = _error(tmp_path, f"{HEADER}\n{GOOD.replace(',11,13,', ',-11,13,')}\n")
    assert "column 'train_time_h': '-11' is not above 0" in message


def test_empty_required_cell(tmp_path: Path):
    message = _error(tmp_path, f"{HEADER}\n{GOOD.replace('nin,32 K20', 'nin,')}\n")
    assert "line 2, column 'hardware': the cell is empty" in message and "required" in message


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_empty_file(tmp_path: Path, content: str):
    message = _error(tmp_path, content)
    assert "the file is empty" in message and "header line" in message and "required: net" in message


def test_header_without_rows(tmp_path: Path):
    assert "a header line but no rows" in _error(tmp_path, HEADER + "\n")


def test_too_many_cells(tmp_path: Path):
    message = _error(tmp_path, f"{HEADER}\n{GOOD}\n{GOOD},extra\n")
    assert "line 3: too many cells, 13 where the header has 12 columns" in message


def test_too_few_cells(tmp_path: Path):
    message = _error(tmp_path, f"{HEADER}\nnin,32 K20,Titan\n")
    assert "line 2: too few cells, 3 where the header has 12 columns (net, hardware" in message


def test_not_utf8(tmp_path: Path):
    message = _error(tmp_path, f"{HEADER}\n".encode() + "nin,32 K20,Titan,Caffé".encode("latin-1") + b"\n")
    assert "line 2: byte 0xe9 is not UTF-8 text" in message and "CSV in UTF-8" in message


def test_missing_file(tmp_path: Path):
    with pytest.raises(FirescaleError, match=r"reference file .*nowhere\.csv does not exist .*firecaffe-table2"):
        read_reference(tmp_path / "nowhere.csv")
    with pytest.raises(FirescaleError, match=r"'.*nowhere\.csv' is neither a shipped reference \(firecaffe-table2, "
                                             r"firecaffe-table3\) nor an existing file"):
        reference_path(str(tmp_path / "nowhere.csv"))


def test_unknown_shipped_name():
    with pytest.raises(FirescaleError, match=r"no shipped reference named 'firecaffe-tabel2'; did you mean "
                                             r"'firecaffe-table2'"):
        shipped_reference("firecaffe-tabel2")
