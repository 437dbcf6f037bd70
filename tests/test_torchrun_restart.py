"""A lost worker under torchrun: with ``--max-restarts`` the agent starts the group again, and the run
continues from its newest complete checkpoint, ending on the weights of a run never interrupted
(data order, every rank's random state and the schedule resume exactly). The same with two torchrun
agents as two nodes of one job (c10d rendezvous on 127.0.0.1): one node killed whole, then started
again with --resume. Processes over gloo on the CPU, a tiny model, dropout on (so the restored
random states matter)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gptkit.testing.processes import free_port
from tests.test_train import alice_shards

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
STEPS, CHECKPOINT_EVERY = 160, 20
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def shards(data_dir, small_tokenizer, tmp_path_factory) -> Path:
    return alice_shards(small_tokenizer, data_dir, tmp_path_factory.mktemp("shards"))


def pretrain_args(shards: Path, out: Path) -> list[str]:
    return [
        *("-m", "gptkit", "pretrain", "--data", str(shards), "--out", str(out), "--preset", "tiny"),
        *("--context-length", "32", "--batch-size", "8", "--micro-batch-size", "2", "--dropout", "0.1"),
        *("--max-steps", str(STEPS), "--warmup-steps", "2", "--checkpoint-every", str(CHECKPOINT_EVERY)),
        *("--keep-checkpoints", "2", "--eval-every", "0", "--log-every", "10", "--precision", "fp32"),
        "--no-progress",
    ]


def torchrun(*launch: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *launch]


def wait_for_checkpoint(out: Path, process: subprocess.Popen, timeout: float = 180) -> int:
    """The step of the first complete checkpoint, once there is one (the run still going)."""
    latest = out / "checkpoints" / "latest.json"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if latest.exists():
            return json.loads(latest.read_text())["step"]
        assert process.poll() is None, "the run ended before its first checkpoint"
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint in {out} after {timeout} s")


def worker_of(agent: subprocess.Popen, rank: int) -> psutil.Process:
    """The training process of global ``rank`` among the torchrun agent's children."""
    deadline = time.time() + 60
    while time.time() < deadline:
        for child in psutil.Process(agent.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank) and "gptkit" in child.cmdline():
                    return child
            except psutil.Error:  # gone, or a zombie, since the listing
                continue
        time.sleep(0.1)
    raise AssertionError(f"no worker of rank {rank} under torchrun (pid {agent.pid})")


def assert_same_weights(expected_dir: Path, got_dir: Path) -> None:
    expected, got = load_file(expected_dir / "model.safetensors"), load_file(got_dir / "model.safetensors")
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)


@pytest.fixture(scope="module")
def uninterrupted(shards, tmp_path_factory) -> Path:
    """Two processes on one node, never interrupted: the weights every restarted run must end on."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = subprocess.run(
        torchrun("--standalone", "--nproc_per_node=2", *pretrain_args(shards, out)),
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_a_worker_killed_after_a_checkpoint_is_restarted_and_the_run_ends_as_if_never_stopped(
    shards, uninterrupted, tmp_path
):
    out = tmp_path / "run"
    launch = torchrun("--standalone", "--nproc_per_node=2", "--max-restarts=2", *pretrain_args(shards, out))
    agent = subprocess.Popen(launch, cwd=REPO, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        step = wait_for_checkpoint(out, agent)
        worker_of(agent, rank=1).send_signal(signal.SIGKILL)
        _, stderr = agent.communicate(timeout=600)
    finally:
        agent.kill()
    assert agent.returncode == 0, stderr[-3000:]
    assert step < STEPS
    # The agent saw its worker killed, and the group it started again formed at the first try.
    assert "exitcode: -9" in stderr and "connectFullMesh failed" not in stderr, stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("step", 0) for r in metrics) == STEPS
    assert_same_weights(uninterrupted, out)


def last_step(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return max((json.loads(line).get("step", 0) for line in lines), default=0)


def workers_alive(*agents: subprocess.Popen) -> bool:
    for agent in agents:
        try:
            children = psutil.Process(agent.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                if child.status() != psutil.STATUS_ZOMBIE and "gptkit" in child.cmdline():
                    return True
            except psutil.Error:  # gone, or a zombie, since the listing
                continue
    return False


def test_a_node_killed_whole_and_started_again_with_resume_rejoins_and_the_run_ends_as_if_never_stopped(
    shards, uninterrupted, tmp_path
):
    """Two agents of one job on 127.0.0.1. Once the run is done, torch's agents wait at their exit
    barrier (the one that stayed waits for the first rendezvous's members, 5 minutes by default), so
    the test waits for the workers, not for the agents."""
    out, port = tmp_path / "run", free_port()
    nodes = (
        "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=restart-test", "--max-restarts=2", "--monitor-interval=0.5",
    )  # fmt: skip

    def node(*extra: str) -> subprocess.Popen:
        # A session of its own: killing the node kills its agent and its worker together.
        return subprocess.Popen(
            torchrun(*nodes, *pretrain_args(shards, out), *extra),
            cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    first = node()  # hosts the rendezvous, and stays
    time.sleep(2)
    second = node()
    again = None
    try:
        step = wait_for_checkpoint(out, first)
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(timeout=60)
        again = node("--resume")  # the node back, with the same command and --resume
        deadline = time.time() + 300
        while time.time() < deadline and (last_step(out) < STEPS or workers_alive(first, again)):
            assert first.poll() is None or first.returncode == 0, "the node that stayed failed"
            time.sleep(0.5)
    finally:
        for process in (first, second, again):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert step < STEPS and last_step(out) == STEPS
    assert_same_weights(uninterrupted, out)


def test_sigterm_to_torchrun_checkpoints_every_process_and_resume_ends_as_if_never_stopped(
    shards, uninterrupted, tmp_path
):
    """What a scheduler does at pre-emption or at the early warning of docs/operations.md's SLURM
    recipe: SIGTERM to the torchrun agent, which sends it on to its workers. Both finish the
    update in flight, agree on the step, save one checkpoint and exit 143; torchrun again with
    --resume ends on the weights of a run never stopped."""
    out = tmp_path / "run"
    agent = subprocess.Popen(
        torchrun("--standalone", "--nproc_per_node=2", *pretrain_args(shards, out)),
        cwd=REPO, env=ENV, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_checkpoint(out, agent)
        agent.send_signal(signal.SIGTERM)
        _, stderr = agent.communicate(timeout=120)
    finally:
        agent.kill()
    assert agent.returncode != 0
    stopped_at = json.loads((out / "checkpoints" / "latest.json").read_text())["step"]
    assert 0 < stopped_at < STEPS, stderr[-3000:]
    # Each worker stopped by the signal, after saving: none was killed by torchrun's shutdown timeout.
    assert stderr.count(f"interrupted at step {stopped_at} (SIGTERM)") == 2, stderr[-3000:]
    assert "exitcode: -9" not in stderr, stderr[-3000:]
    resumed = subprocess.run(
        torchrun("--standalone", "--nproc_per_node=2", *pretrain_args(shards, out), "--resume"),
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert last_step(out) == STEPS
    assert_same_weights(uninterrupted, out)


def slurm_recipe(shards: Path, out: Path) -> str:
    """docs/operations.md's SLURM batch script, on 2 processes of this machine with the tests' run."""
    text = (REPO / "docs" / "operations.md").read_text()
    script = text[text.index("#!/bin/bash") :]
    script = script[: script.index("```")]
    documented = "--data /shared/shards --out /shared/runs/pre --checkpoint-every 500"
    assert documented in script and "--nproc_per_node=8" in script
    ours = " ".join(pretrain_args(shards, out)[3:])  # after "-m gptkit pretrain"
    return script.replace(documented, ours).replace("--nproc_per_node=8", "--nproc_per_node=2")


def slurm_commands(folder: Path) -> Path:
    """Stand-ins for ``srun`` and ``scancel`` that treat a job step as SLURM does, so far as the
    recipe meets them, and ``scontrol`` that names this machine and records requeues."""
    folder.mkdir()
    (folder / "srun").write_text(
        "#!/bin/bash\n"
        # slurmstepd starts the step's task in a process group of its own (job control does here)
        "set -m\n"
        # proctrack/cgroup holds every process the task starts in the step's cgroup, whatever its
        # session (torchrun starts each worker in a new one): a variable they all inherit stands for
        # it; the first srun of a batch script is step 0
        'SLURM_STANDIN_STEP="$SLURM_JOB_ID.0" "$@" &\n'
        "task=$!\n"
        # srun answers SIGTERM, SIGHUP and SIGQUIT with SIGKILL to the whole step (srun_job.c,
        # _srun_signal_mgr: "forcing job termination"); a single SIGINT only prints the step's status
        """trap 'scancel --signal=KILL "$SLURM_JOB_ID.0"' TERM HUP QUIT\n"""
        # srun exits when its task has, with its status; bash's wait returns early to run a trap,
        # and a later wait still gives the status of the task that ended
        'while kill -0 "$task" 2>/dev/null; do wait "$task"; done\n'
        'wait "$task"\n'
    )
    (folder / "scancel").write_text(
        "#!/bin/bash\n"
        # scancel --signal=SIG (or -s SIG) JOB.STEP signals the step and cancels nothing; slurmstepd
        # sends SIG to every process of the step's cgroup: here, every process srun marked
        'case "$1" in --signal=*) sig=${1#--signal=}; shift ;; -s) sig=$2; shift 2 ;; *) exit 2 ;; esac\n'
        "for environ in /proc/[0-9]*/environ; do\n"
        '    grep -qzxF "SLURM_STANDIN_STEP=$1" "$environ" 2>/dev/null || continue\n'
        '    pid=${environ#/proc/}; kill -s "$sig" "${pid%/environ}" 2>/dev/null\n'
        "done\n"
        "exit 0\n"
    )
    (folder / "scontrol").write_text(
        '#!/bin/bash\ncase "$1" in show) echo 127.0.0.1 ;; *) echo "$@" >> "$SCONTROL_LOG" ;; esac\n'
    )
    for command in ("srun", "scancel", "scontrol"):
        (folder / command).chmod(0o755)
    return folder


def port_for_job() -> tuple[int, int]:
    """A job id whose port in the recipe (20000 + id mod 20000) is free here."""
    import socket

    for port in range(21000 + os.getpid() % 15000, 40000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port - 20000, port
    raise AssertionError("no free port in 21000-40000")


def test_the_documented_slurm_recipe_checkpoints_at_its_early_warning_requeues_and_resumes(
    shards, uninterrupted, tmp_path
):
    """The batch script of docs/operations.md as SLURM runs it, with stand-ins for srun, scancel
    and scontrol: the early warning (SIGUSR1 to the script) checkpoints both processes and requeues the
    job; the requeued start (SLURM_RESTART_COUNT=1) resumes and ends on the weights of a run never
    stopped, without requeueing again."""
    out, log = tmp_path / "run", tmp_path / "scontrol.log"
    script = tmp_path / "job.sh"
    script.write_text(slurm_recipe(shards, out))
    job_id, _ = port_for_job()
    commands = slurm_commands(tmp_path / "bin")
    env = {
        **ENV,
        "PATH": f"{commands}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NODELIST": "localhost", "SLURM_NNODES": "1",
        "SLURM_CPUS_PER_TASK": "1", "SCONTROL_LOG": str(log),
    }  # fmt: skip
    first = subprocess.Popen(["bash", str(script)], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_checkpoint(out, first)
        first.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 sends, to the script alone
        _, stderr = first.communicate(timeout=180)
    finally:
        first.kill()
        # the end of the job: SLURM kills whatever of its step still runs
        subprocess.run([commands / "scancel", "--signal=KILL", f"{job_id}.0"], check=False)
    assert first.returncode == 0, stderr[-3000:]
    assert log.read_text().split() == ["requeue", str(job_id)]
    stopped_at = json.loads((out / "checkpoints" / "latest.json").read_text())["step"]
    assert 0 < stopped_at < STEPS
    assert stderr.count(f"interrupted at step {stopped_at} (SIGTERM)") == 2, stderr[-3000:]
    again = subprocess.run(
        ["bash", str(script)], cwd=REPO, env={**env, "SLURM_RESTART_COUNT": "1"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert log.read_text().split() == ["requeue", str(job_id)]  # not requeued again
    assert last_step(out) == STEPS
    assert_same_weights(uninterrupted, out)
