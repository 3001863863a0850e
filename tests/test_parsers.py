"""No firescale parser takes an abbreviated option: every parser the CLI builds (the top one, each group's, each
subcommand's) and each `python -m` module's refuses a long option cut short, as `--frame` for --framework.

A run record keeps its command line; with argparse's prefix matching on, `--frame pytorch` there trained with
PyTorch while a reader looking for `--framework` found none (train/options.py)."""
from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterator

import pytest

from firescale import cli

# The modules run as `python -m MODULE`, each with the parser its main parses (`build_parser`); those that import
# a framework at the top need its backend.
MODULES = [pytest.param("firescale.bench.gpu_steps", marks=pytest.mark.pytorch),
           pytest.param("firescale.bench.bare_loop_torch", marks=pytest.mark.pytorch),
           "firescale.bench.bare_loop", "firescale.cluster.horovod_build", "firescale.cluster.torch_install"]


def _with_subparsers(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _with_subparsers(f"{name} {sub}", subparser)


def _cli_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser `firescale` builds: the top one, each group's with the subparsers it names, and each
    subcommand's, which parses its arguments."""
    yield "firescale", cli._top_parser()
    for group, table in cli.COMMANDS.items():
        yield from _with_subparsers(f"firescale {group}", cli.build_parser(group))
        for name in table:
            if name is not None:
                yield f"firescale {group} {name}", cli.command_parser(group, name)


def _abbreviations(parser: argparse.ArgumentParser) -> list[str]:
    """Each long option less its last letter, where that names no other option: what prefix matching would
    have taken for it."""
    options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    return [o[:-1] for o in options if len(o) > 3 and not any(p.startswith(o[:-1]) for p in options if p != o)]


def _refuses(parser: argparse.ArgumentParser, abbreviation: str, capsys) -> None:
    """`abbreviation` alone is an unrecognized argument to `parser`.  Its required arguments are made optional
    first (this parser is built for the test alone): otherwise their absence would be the error said."""
    for action in parser._actions:
        action.required = False
    for group in parser._mutually_exclusive_groups:
        group.required = False
    with pytest.raises(SystemExit) as exit:
        parser.parse_args([abbreviation])
    assert exit.value.code == 2
    assert f"unrecognized arguments: {abbreviation}" in capsys.readouterr().err, abbreviation


def test_every_parser_the_cli_builds_refuses_an_abbreviated_option(capsys):
    checked = 0
    for name, parser in _cli_parsers():
        assert parser.allow_abbrev is False, name
        for abbreviation in _abbreviations(parser):
            _refuses(parser, abbreviation, capsys)
            checked += 1
    assert checked > 300      # every subcommand's options: the walk reached them


def test_the_trainers_parser_refuses_frame_for_framework(capsys):
    parser = cli.build_parser("train")
    options = parser.parse_args(["--dataset", "d", "--solver", "s.yaml", "--out", "o", "--framework", "pytorch"])
    assert options.framework == "pytorch"
    with pytest.raises(SystemExit):
        parser.parse_args(["--dataset", "d", "--solver", "s.yaml", "--out", "o", "--frame", "pytorch"])
    assert "unrecognized arguments: --frame pytorch" in capsys.readouterr().err


@pytest.mark.parametrize("module", MODULES)
def test_every_python_m_parser_refuses_an_abbreviated_option(module, capsys):
    parser = importlib.import_module(module).build_parser()
    assert parser.allow_abbrev is False
    abbreviations = _abbreviations(parser)
    assert abbreviations
    for abbreviation in abbreviations:
        _refuses(importlib.import_module(module).build_parser(), abbreviation, capsys)
