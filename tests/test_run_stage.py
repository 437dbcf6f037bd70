"""run_stage, both stages' one setup: the run directory is locked before the process group starts,
and on the way out the group goes first, the lock last; a run refused at the lock starts no group."""

from __future__ import annotations

import pytest

from gptkit.train import run
from gptkit.train.distributed.processes import DistributedContext
from gptkit.train.rundir import LOCK, RunDir, RunDirBusy


@pytest.fixture
def events(monkeypatch, tmp_path) -> list[str]:
    """What happens, in order, with whether the run directory's lock is held at each step."""
    happened: list[str] = []
    lock = tmp_path / "run" / LOCK

    def held() -> str:
        return "locked" if lock.exists() and lock.read_text() else "unlocked"

    def start(device, *process_group_settings):
        happened.append(f"start ({held()}) {process_group_settings}")
        return DistributedContext()

    monkeypatch.setattr(run, "init_distributed", start)
    monkeypatch.setattr(run, "shutdown_distributed", lambda: happened.append(f"shut down ({held()})"))
    return happened


def test_the_lock_comes_first_and_goes_last_also_on_an_error(events, tmp_path):
    out = tmp_path / "run"
    with run.run_stage(out, resume=False, command="pretrain", device="cpu") as ctx:
        events.append("train")
        assert ctx.is_main
    assert events == ["start (locked) (False, False, 600.0)", "train", "shut down (locked)"]
    assert (out / LOCK).read_text() == ""  # let go

    events.clear()
    with pytest.raises(RuntimeError, match="boom"):
        with run.run_stage(tmp_path / "run", resume=True, command="finetune", device="cpu"):
            raise RuntimeError("boom")
    assert events == ["start (locked) (False, False, 600.0)", "shut down (locked)"]
    assert (out / LOCK).read_text() == ""


def test_the_process_group_is_started_as_the_run_asks(events, tmp_path):
    """FSDP2, its offload (gloo beside NCCL) and the collectives' timeout reach the process group."""
    from gptkit.train.config import TrainConfig

    train = TrainConfig(fsdp=True, fsdp_offload=True, collective_timeout="45m")
    with run.run_stage(tmp_path / "run", resume=False, command="pretrain", device="cpu", train=train):
        pass
    assert events[0] == "start (locked) (True, True, 2700.0)"


def test_a_run_refused_at_the_lock_starts_no_process_group(events, tmp_path):
    out = tmp_path / "run"
    with RunDir(out).writer_lock("another run"):
        with pytest.raises(RunDirBusy, match="another run"):
            with run.run_stage(out, resume=False, command="pretrain", device="cpu"):
                pass
    assert events == []


def test_torchrun_restarts_continue_only_the_run_their_own_job_started(tmp_path, monkeypatch):
    """A group torchrun starts again continues the run in --out without --resume, but only the run
    its job started (run_config.json records the job): a directory the first group refused, since
    another job's run was there, is refused again."""
    from gptkit.io import write_json
    from gptkit.train.run import TORCHRUN_JOB, resuming

    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert not resuming(False, out)  # the first group: nothing to continue
    write_json(out / "run_config.json", {"stage": "pretrain", TORCHRUN_JOB: "job-a"})
    assert not resuming(False, out) and resuming(True, out)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resuming(False, out)  # started again: its own job's run
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")
    assert not resuming(False, out)  # another job's run
    write_json(out / "run_config.json", {"stage": "pretrain"})  # a run started outside torchrun
    assert not resuming(False, out)
    (out / "run_config.json").write_text("[not a mapping")
    assert not resuming(False, out)
