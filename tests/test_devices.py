"""Device handling that a CPU machine can show: checkpoints record where their generators ran
and refuse another device type in one line, RNG restore with another GPU count, which GPU a
local rank takes, ``device=cuda:k`` checked, the CUDA numerics policy, state gathered as CPU
tensors. The CUDA side of each is in ``test_gpu_readiness.py``."""

from __future__ import annotations

import inspect
import socket

import pytest
import torch
import torch.distributed as dist
from support.grab_run import SMALL_RUN, compose_config, run_job_here
from support.helpers import make

from grab_exp.balance.projection import describe
from grab_exp.devices import resolve_device, set_cuda_policy
from grab_exp.distributed.comm import cpu_tensors
from grab_exp.distributed.join import init_distributed, local_cuda_index, rank_cuda_index
from grab_exp.runner.config import check as config_check
from grab_exp.runner.config.check import validate_config
from grab_exp.runner.config.schema import ConfigError
from grab_exp.runner.rundir.checkpoint import (
    CHECKPOINT_NAME,
    FORMAT,
    cuda_states_to_restore,
    upgrade,
)

CUDA_GENERATOR_STATE = torch.zeros(16, dtype=torch.uint8)  # a CUDA generator's state: 16 bytes


def test_a_checkpoint_written_on_another_device_type_is_refused_in_one_line(tmp_path):
    run = [*SMALL_RUN, "device=cpu", "balance=recursive", "dataset.num_train=48"]
    run_job_here([*run, "epochs=1"], tmp_path)
    state = torch.load(tmp_path / CHECKPOINT_NAME, weights_only=True)
    assert state["format"] == FORMAT and state["device_type"] == "cpu"
    assert state["ordering"]["generator_device"] == "cpu"
    state["device_type"] = "cuda"  # as a job on a GPU machine would have written it
    torch.save(state, tmp_path / CHECKPOINT_NAME)
    (tmp_path / "summary.json").unlink()  # an interrupted run: resumed, not skipped
    with pytest.raises(ConfigError) as refused:
        run_job_here([*run, "epochs=1"], tmp_path)
    message = str(refused.value)
    assert message == (
        "device: the checkpoint was written on cuda, this job runs on cpu; resume with "
        "device=cuda, or overwrite=true to start over"
    )


def test_an_ordering_state_of_another_generator_device_type_is_refused():
    bal = make("recursive", 12, 5, depth=2, projection_dim=3)
    state = bal.state_dict()
    assert state["generator_device"] == "cpu"
    assert state["projection"] == describe(bal.projection)
    assert state["projection"]["device_type"] == "cpu"  # R depends on the generator's device
    make("recursive", 12, 5, depth=2, projection_dim=3).load_state_dict(state)  # same: loads
    with pytest.raises(ValueError, match=r"generator_device is 'cuda', this ordering has 'cpu'"):
        bal.load_state_dict({**state, "generator_device": "cuda"})


def test_format_2_checkpoints_get_device_types_from_their_generator_states():
    cpu_ordering = make("mean", 6, 4, projection_dim=2).state_dict()
    for key in ("generator_device",):
        del cpu_ordering[key]
    del cpu_ordering["projection"]["device_type"]
    cuda_worker = {"variant": "cd_grab", "generator": CUDA_GENERATOR_STATE}
    single = upgrade({"format": 2, "strategy": "single", "ordering": cpu_ordering})
    assert single["format"] == FORMAT and single["device_type"] == "cpu"
    assert single["ordering"]["generator_device"] == "cpu"
    assert single["ordering"]["projection"]["device_type"] == "cpu"
    parallel = upgrade({"format": 2, "ordering": [cuda_worker, dict(cuda_worker)]})
    assert parallel["device_type"] == "cuda"
    assert [w["generator_device"] for w in parallel["ordering"]] == ["cuda", "cuda"]
    assert upgrade({"format": 2, "ordering": {"variant": "rr_without_state"}})["device_type"] == (
        "cpu"
    )


def test_rng_restore_takes_only_the_saved_states_of_gpus_present():
    saved = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]
    assert [s[0].item() for s in cuda_states_to_restore(saved, 2)] == [0, 1]  # 4 saved, 2 here
    assert [s[0].item() for s in cuda_states_to_restore(saved[:1], 2)] == [0]  # 1 saved, 2 here
    assert cuda_states_to_restore(saved, 0) == []


@pytest.mark.parametrize(
    ("local_rank", "count", "visible", "index"),
    [(0, 2, None, 0), (1, 2, None, 1), (1, 1, "3", 0), (0, 1, "0", 0)],
)
def test_each_local_rank_takes_its_own_gpu(local_rank, count, visible, index):
    assert local_cuda_index(local_rank, count, visible) == index


@pytest.mark.parametrize(
    ("local_rank", "count", "visible"), [(1, 1, None), (1, 1, "0,1"), (2, 2, None), (0, 0, None)]
)
def test_a_local_rank_without_a_gpu_of_its_own_is_one_line(local_rank, count, visible):
    with pytest.raises(ValueError) as refused:
        local_cuda_index(local_rank, count, visible)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"distributed: LOCAL_RANK={local_rank} has no GPU of its own")
    assert "distributed.backend=gloo" in message


def test_cuda_k_is_checked_against_the_gpus_present():
    absent = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU, on any machine
    with pytest.raises(ConfigError, match=rf"^device: got '{absent}'; allowed: "):
        validate_config(compose_config([*SMALL_RUN, f"device={absent}"]))
    assert resolve_device("cpu") == torch.device("cpu")


def _numerics_settings() -> dict[str, object]:
    """Every reader of the CUDA numerics flags, legacy and new (a mix of the two raises)."""
    backends = torch.backends
    return {
        "deterministic": backends.cudnn.deterministic,
        "benchmark": backends.cudnn.benchmark,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "matmul_allow_tf32": backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": backends.cudnn.allow_tf32,
        "matmul": backends.cuda.matmul.fp32_precision,
        "conv": backends.cudnn.conv.fp32_precision,
        "rnn": backends.cudnn.rnn.fp32_precision,
    }


@pytest.fixture
def restore_numerics():
    """Put torch's numerics flags back as they were (legacy first, as set_cuda_policy does)."""
    before = _numerics_settings()
    yield
    backends = torch.backends
    backends.cudnn.deterministic, backends.cudnn.benchmark = (
        before["deterministic"],
        before["benchmark"],
    )
    torch.set_float32_matmul_precision(before["matmul_precision"])
    backends.cuda.matmul.allow_tf32 = before["matmul_allow_tf32"]
    backends.cudnn.allow_tf32 = before["cudnn_allow_tf32"]
    backends.cuda.matmul.fp32_precision = before["matmul"]
    backends.cudnn.conv.fp32_precision = before["conv"]
    backends.cudnn.rnn.fp32_precision = before["rnn"]


@pytest.mark.usefixtures("restore_numerics")
@pytest.mark.parametrize("tf32", [False, True])
def test_cuda_policy_sets_deterministic_cudnn_and_the_tf32_choice_through_both_apis(tf32):
    before = _numerics_settings()
    set_cuda_policy(torch.device("cpu"), tf32=True)
    assert _numerics_settings() == before  # nothing changes on the CPU
    set_cuda_policy(torch.device("cuda"), tf32=tf32)
    precision = "tf32" if tf32 else "ieee"
    assert _numerics_settings() == {  # every reader agrees (none raises a legacy/new mix)
        "deterministic": True,
        "benchmark": False,
        "matmul_precision": "high" if tf32 else "highest",
        "matmul_allow_tf32": tf32,
        "cudnn_allow_tf32": tf32,
        "matmul": precision,
        "conv": precision,
        "rnn": precision,
    }
    a = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(a @ a.T, torch.tensor([[5.0, 14.0], [14.0, 50.0]]))  # a matmul runs


def test_gathered_objects_keep_their_structure_with_tensors_on_the_cpu():
    obj = {"a": [torch.ones(2), (torch.zeros(1), 3)], "b": "text", "c": None}
    out = cpu_tensors(obj)
    assert isinstance(out["a"][1], tuple) and out["a"][1][1] == 3 and out["b"] == "text"
    assert all(t.device.type == "cpu" for t in (out["a"][0], out["a"][1][0]))
    assert torch.equal(out["a"][0], obj["a"][0])


def test_backend_auto_with_device_cpu_joins_with_gloo_on_any_machine(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0"}
    for name, value in {**env, "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    comm, device = init_distributed("auto", timeout_s=30, device="cpu")
    try:
        assert device == torch.device("cpu") and dist.get_backend() == "gloo"
        assert comm.gather_objects({"t": torch.ones(2)})[0]["t"].device.type == "cpu"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("device", "count", "env", "index"),
    [
        ("cuda", 4, {"LOCAL_RANK": "2"}, 2),  # torchrun's rank 2: its own GPU, not GPU 0
        ("auto", 4, {"LOCAL_RANK": "3"}, 3),
        ("cuda", 4, {}, 0),  # one process
        ("cuda:1", 4, {"LOCAL_RANK": "3"}, 1),  # named: as named
        ("cuda", 1, {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "5"}, 0),  # its launcher's one GPU
    ],
)
def test_the_memory_check_asks_about_the_gpu_the_rank_will_train_on(device, count, env, index):
    """``validate_config`` runs before the rank sets its device: it must neither ask GPU 0 for
    every rank nor make a context there (``mem_get_info`` would; device properties do not)."""
    assert rank_cuda_index(device, count, env) == index
    source = inspect.getsource(config_check._memory_bytes)
    assert "mem_get_info" not in source.split('"""')[-1]  # the code, not its docstring
