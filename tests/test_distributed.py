"""Multi-process start-up from the environment, and the settings a resumed run may change.

The processes themselves (training, a lost process, resume) are tested in
parity_tests/test_train_multiprocess.py.
"""

from __future__ import annotations

import pytest

from vit_jax.distributed import cluster_env
from vit_jax.train import TrainConfig, config_mismatch


def test_the_environment_names_the_processes_or_leaves_one():
    assert cluster_env({}) is None
    assert cluster_env({"SLURM_NTASKS": "1", "OMPI_COMM_WORLD_SIZE": "1"}) is None
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert cluster_env(env) == {"num_processes": 4, "process_id": 3}
    assert cluster_env({**env, "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}) is None
    assert cluster_env({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}) == {}  # jax finds the rest (cluster detection)
    assert cluster_env({"SLURM_NTASKS": "8"}) == {} and cluster_env({"OMPI_COMM_WORLD_SIZE": "2"}) == {}
    with pytest.raises(ValueError, match="JAX_PROCESS_ID='one': expected an int"):
        cluster_env({**env, "JAX_PROCESS_ID": "one"})


def test_resume_may_change_the_timeouts_but_nothing_else():
    assert TrainConfig.settings() == ["heartbeat_timeout", "init_timeout", "shutdown_timeout", "barrier_timeout"]
    saved = {"model": {}, "train": TrainConfig().to_dict()}
    now = {"model": {}, "train": TrainConfig(heartbeat_timeout=5, barrier_timeout=60, lr=1e-3).to_dict()}
    assert config_mismatch(saved, now) == ["train.lr: checkpoint has 0.002, now 0.001"]
    for name in TrainConfig.settings():
        with pytest.raises(ValueError, match=f"{name}=0: expected an integer in \\[1, "):
            TrainConfig(**{name: 0})
