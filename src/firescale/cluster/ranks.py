"""Start ranks on this machine as a site's jobs would: its launcher, its options and its environment.

Calibration measurements (a short training run, Horovod's allreduce) must see what the sweep's jobs
see: the same binding of ranks to cores and the same MPI settings.  Only a site without a scheduler
runs them here; on a cluster they belong in a job.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from firescale.cluster.collectives import site_allreduce
from firescale.cluster.horovod import site_horovod_environment
from firescale.cluster.launchers import Placement, wrap
from firescale.cluster.site import SiteProfile
from firescale.errors import FirescaleError
from firescale.frameworks import DEFAULT_FRAMEWORK, FRAMEWORKS, REGISTRY
from firescale.nets.spec import NetSpec
from firescale.testing.vcluster import VirtualCluster

# One task of a step: its own --out (positional, never spliced into the script) and its own log beside it,
# Slurm's step id cleared, and a session folder of its own for Open MPI: two singletons starting at once on a
# node race to create the shared /tmp/ompi.HOST.UID and one fails ("File exists"; 2 of 30 steps here).
_OWN_COPY = ('out="$0-$SLURM_PROCID"; unset SLURM_STEP_ID SLURM_STEPID; '
             'session=$(mktemp -d) || exit 1; export OMPI_MCA_orte_tmpdir_base="$session"; '
             '"$@" "$out" > "$out.log" 2>&1; status=$?; rm -rf "$session"; exit $status')


@dataclass(frozen=True)
class SiteRanks:
    """A launcher for n ranks of a site, with the environment its job scripts export: as many ranks per node
    as a node has devices (`per_node`; 0: all on one node), one core each; on the virtual cluster, the cluster
    (`vcluster`), whose client shims the launcher goes through from outside it."""

    site: str
    launcher: str
    options: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    per_node: int = 0
    vcluster: VirtualCluster | None = None

    def environment(self) -> dict[str, str]:
        """The environment the launcher starts in: this process's, with the site's variables.  On the virtual
        cluster, outside its jobs, its client shims come first on PATH, since its srun reaches the controller
        only through them (inside a job, on one of its nodes, it reaches it directly); an error saying what to
        run when the cluster is not up."""
        env = {**os.environ, **self.env}
        if self.vcluster is not None and "SLURM_JOB_ID" not in os.environ:
            env["PATH"] = self.vcluster.clients_first(env.get("PATH", ""), f"site {self.site}")
        return env

    def on_a_node(self, ranks: int) -> int:
        """How many of `ranks` ranks the fullest node runs, as argv places them."""
        return min(ranks, self.per_node or ranks)

    def argv(self, ranks: int, command: Sequence[str]) -> list[str]:
        per_node = self.on_a_node(ranks)
        placement = Placement(ranks, per_node, 1, -(-ranks // per_node))
        return [str(a) for a in wrap(self.launcher, list(command), placement, self.options)]

    def copies_argv(self, copies: int, command: Sequence[str], out: str | os.PathLike[str], *,
                    nodes: int = 1) -> list[str]:
        """argv of one job step that runs `copies` copies of a single-rank `command` at once on each of `nodes`
        nodes, with no MPI between them: copy i (of copies x nodes) appends OUT-i to `command` (which ends with
        its --out option) and writes its output to OUT-i.log.

        Each copy is a process of its own, as a rank computing beside its node's other ranks is: Open MPI
        (under Horovod) starts it as a singleton once Slurm's step id is out of its environment.  Only srun
        places tasks of one step on one node here.
        """
        if self.launcher != "srun":
            raise FirescaleError(f"site {self.site}: copies of a run on one of its nodes start through srun only, "
                                 f"not {self.launcher}; leave the node's contention out")
        options = [o for o in self.options if not o.startswith("--mpi")]
        return ["srun", f"--nodes={nodes}", f"--ntasks={copies * nodes}", f"--ntasks-per-node={copies}",
                "--mpi=none", *options,
                "sh", "-c", _OWN_COPY, str(out), *command]

    def run(self, ranks: int, command: Sequence[str], what: str, *, timeout: float = 900.0) -> str:
        """Run `command` as `ranks` ranks; its standard output, or an error naming `what` failed.  Past `timeout`
        or when interrupted, the launcher is stopped (`stop`)."""
        argv = self.argv(ranks, command)
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=self.environment(), start_new_session=True)
        except FileNotFoundError:
            raise FirescaleError(f"{what}: {argv[0]}, the launcher of site {self.site}'s ranks, is not on the PATH "
                                 "here") from None
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            raise FirescaleError(f"{what} ({ranks} ranks on site {self.site}) did not finish in {timeout:g} s "
                                 "and was stopped") from None
        except BaseException:     # interrupted (Ctrl-C, the job's TERM): the ranks go too
            stop(proc)
            raise
        if proc.returncode != 0:
            lines = _without_launcher_notices((stderr or stdout).strip().splitlines())
            tail = "\n".join([line for line in lines if "firescale: error" in line] or lines[-5:])
            raise FirescaleError(f"{what} ({ranks} ranks on site {self.site}) failed with exit code "
                                 f"{proc.returncode}: {tail}")
        return stdout


def stop(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """Stop a launcher (or a run) if it still runs, as a user would: SIGTERM first, which srun turns into
    cancelling its step on the nodes (a killed srun cannot) and mpirun passes on to its ranks; SIGKILL after
    `grace_s`.  Started in a session of its own (start_new_session), its whole process group goes at the end:
    no rank it started here is left computing beside what runs next."""
    try:
        own_group = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:    # already reaped: nothing of it to stop
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    if own_group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    elif proc.poll() is None:
        proc.kill()
    proc.communicate()


def _without_launcher_notices(lines: list[str]) -> list[str]:
    """A failed run's output less the launcher's own notices (Open MPI frames each between lines of dashes,
    "Primary job terminated normally, but 1 process returned a non-zero exit code..."), so that what is
    quoted is the rank's own error; all of it when nothing else is left."""
    kept, inside = [], False
    for line in lines:
        if line.startswith("-----") and set(line.strip()) == {"-"}:
            inside = not inside
        elif not inside:
            kept.append(line)
    return kept or lines


def site_ranks(site: SiteProfile) -> SiteRanks:
    """How `site`'s jobs start ranks, for use on this machine (root may run Open MPI here), or, on a site with
    a scheduler, inside an allocation of its nodes (srun with the site's MPI plugin, as its job scripts)."""
    options = list(site.config.get("launcher_options") or [])
    if site.config["launcher"] == "mpirun" and os.geteuid() == 0:
        options.append("--allow-run-as-root")
    if site.config["launcher"] == "srun" and site.config.get("srun_mpi"):
        options.insert(0, f"--mpi={site.config['srun_mpi']}")
    variables = (site.config.get("environment") or {}).get("variables") or {}
    env = {**{k: str(v) for k, v in variables.items()},
           **site_allreduce(site).environment(), **site_horovod_environment(site)}
    return SiteRanks(site.name, site.config["launcher"], tuple(options), env,
                     site.gpus_per_node if site.max_nodes > 1 else 0, _virtual_cluster(site))


def _virtual_cluster(site: SiteProfile) -> VirtualCluster | None:
    """The virtual cluster `site` runs on (its `vcluster:` folder), as large as the site's nodes; None on a
    real cluster."""
    folder = site.config.get("vcluster")
    if folder is None:
        return None
    return VirtualCluster(root=Path(os.path.expandvars(os.path.expanduser(folder))), nodes=site.max_nodes,
                          cpus_per_node=int(site.config["node"]["cores"]))


def node_probe_ranks(site: SiteProfile, ranks: int) -> int:
    """The ranks of a second allreduce probe, over one node, beside a probe over `ranks` (0: none): on a site
    with a link inside its nodes whose `ranks` span nodes of several ranks, so that each link gets a factor
    of its own.  The workflow budgets the calibration job's probes by it; `predict calibrate` and `bench
    predict` probe by it."""
    per_node = site_ranks(site).on_a_node(ranks)
    return per_node if site.intra_node_link is not None and 1 < per_node < ranks else 0


def copies_step(site: SiteProfile) -> SiteRanks | None:
    """Where copies of a single-rank run go to share one of `site`'s nodes (a contention measurement): its
    ranks (SiteRanks.copies_argv: one job step) on a site with a scheduler whose launcher is srun; None
    elsewhere, where they run on this machine's cores (in a job: its first node's).  `predict calibrate`
    and `bench predict` both ask it."""
    return site_ranks(site) if site.scheduler != "local" and site.launcher == "srun" else None


def contention_nodes(site: SiteProfile, ranks: int) -> list[int]:
    """The node counts a calibration's contention copies run on in each round, beside a probe over `ranks`
    ranks: none where a node holds one of them; one node; and where they span several nodes and the copies
    run as a job step (copies_step), that many nodes at once too (what a point's nodes share)."""
    here = site_ranks(site)
    per_node = here.on_a_node(ranks)
    if per_node < 2:
        return []
    return sorted({1, -(-ranks // per_node) if copies_step(site) else 1})


PROBE_ROUNDS = 3            # launches of the allreduce probe; the fastest is taken
PROBE_TIMEOUT_S = 300.0     # a round still running then is stopped with its ranks and left out
CONTENTION_ROUNDS = 3       # rounds of a calibration's contention copies; the median is taken
RUN_TIMEOUT_S = 600.0       # a short run, or a step of its copies, still running then is stopped


def timeout_within(walltime_s: float, steps: int, longest: float) -> float:
    """A time limit for each of `steps` steps of a calibration job such that all of them running out of it
    take at most half of the job's walltime: the probe rounds get one half, the short run and the rounds of
    its contention copies the other (the fit takes seconds).  No longer than `longest` and no shorter than a
    minute (a probe round or a step of copies takes under one on the virtual cluster); whole seconds."""
    if steps < 1 or walltime_s <= 0:
        raise FirescaleError(f"a time limit within a walltime needs 1 or more steps and a walltime > 0, not "
                             f"{steps} and {walltime_s} s")
    return float(max(60, min(longest, walltime_s / 2 / steps) // 1))


def probe_allreduce(ranks_here: SiteRanks, ranks: int, spec: NetSpec, out: str | os.PathLike[str],
                    *, step_s: float = 0.0, batch_per_rank: int = 1, reps: int = 100, timeout: float = 600.0,
                    overlap_s: float = 0.0, framework: str = DEFAULT_FRAMEWORK, process_group: str = "auto") -> None:
    """Time the allreduce of `spec`'s gradients that `framework`'s trainer pays, over `ranks` ranks started as
    the site starts them, into `out` (`firescale bench allreduce --json` format): the communication
    measurement a calibration fits.

    A framework whose allreduce waits for a negotiation cycle (tensorflow: Horovod's) is timed as its trainer
    sums them (one group of tensors), each inside an iteration shaped as the trainer's that takes `step_s`
    without it (fed `batch_per_rank` images each time), since the cycle makes the allreduce's time depend on the
    step before it; with `overlap_s` also with its requests made as `overlap_s` of compute starts (the backward
    pass the trainer's --overlap-allreduce hides it behind): how much of it can hide.  Another (pytorch: its
    Rank.sum) on its own, over `process_group` where it names one, as its --process-group takes it (auto: NCCL
    on GPUs, on CPUs MPI under an MPI launcher, else Gloo): it has no cycle to wait for, so the step is not run,
    and how much of it hides is not measured."""
    if ranks < 2:
        raise FirescaleError(f"an allreduce probe needs 2 or more ranks, not {ranks}")
    try:
        chosen = REGISTRY[framework]
    except KeyError:
        raise FirescaleError(f"an allreduce probe times the {' or the '.join(FRAMEWORKS)} trainer's allreduce, not "
                             f"{framework!r}'s") from None
    shape = ["--gradients-of", spec.name, "--input", ",".join(str(x) for x in spec.input_shape),
             "--classes", str(spec.num_classes), "--reps", str(reps), "--json", str(out)]
    command = [sys.executable, "-m", "firescale", "bench", "allreduce"]
    if chosen.name != DEFAULT_FRAMEWORK:
        command += ["--framework", chosen.name]
    command += ["--algorithms", chosen.algorithm]
    if overlap_s > 0 and not chosen.probe_overlap:
        hiding = [f.library for f in REGISTRY.values() if f.probe_overlap]
        raise FirescaleError(f"the {chosen.library} allreduce probe times the allreduce on its own: how much of it "
                             f"hides behind backward is measured only for {' and '.join(hiding)}'s")
    if chosen.names_process_group:
        command += ["--process-groups", process_group]
    if chosen.negotiation_cycle:
        command += ["--compute-ms", f"{step_s * 1e3:.4f}", "--batch-per-rank", str(batch_per_rank)]
    if overlap_s > 0:
        command += ["--overlap-ms", f"{overlap_s * 1e3:.4f}"]
    ranks_here.run(ranks, [*command, *shape], f"the {chosen.library} allreduce probe", timeout=timeout)
