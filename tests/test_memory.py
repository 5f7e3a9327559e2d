"""benchmarks/memory.py: XLA's memory analysis of the benchmark program from abstract inputs equals what
`vit bench` records from the real one; its GPU-target parsing and bad arguments."""

from __future__ import annotations

import pytest

from benchmarks import contenders, memory
from vit_common.config import ViTConfig
from vit_jax.memory_plan import compute_capability


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["infer", "train"])
def test_abstract_compile_gives_the_benchmarks_memory_figure(mode):
    record = memory.analyse("mu/16", 2, "bfloat16", mode, None, None)
    bench = contenders.build("vit_jax", ViTConfig.from_name("mu/16"), mode, 2, "bfloat16")
    assert record["platform"] == "cpu" and record["attention_kernel"] == "explicit"
    assert record["footprint_bytes"] == bench.memory_bytes > 0
    donated = record["alias_bytes"]
    assert (donated > 0) == (mode == "train")  # the training step donates parameters and optimizer state
    total = record["argument_bytes"] + record["output_bytes"] - donated + record["temp_bytes"]
    assert record["footprint_bytes"] == total


def test_compute_capability_from_a_gpu_target_config():
    assert compute_capability("gpu_device_info {\n cuda_compute_capability {\n major: 9\n }\n}") == (9, 0)
    text = "gpu_device_info { core_count: 108 cuda_compute_capability { major: 8 minor: 6 } }"
    assert compute_capability(text) == (8, 6)
    with pytest.raises(ValueError, match="cuda_compute_capability"):
        compute_capability("platform_name: 'ROCM'")


def test_bad_arguments_are_usage_errors(tmp_path, capsys):
    for argv, needle in [
        (["--gpu-target", str(tmp_path / "missing.txtpb")], "missing.txtpb"),
        (["--batch", "0"], "--batch=0"),
    ]:
        with pytest.raises(SystemExit) as e:
            memory.main(argv)
        assert e.value.code == 2 and needle in capsys.readouterr().err


def test_the_plans_models_and_their_table():
    from benchmarks import plans

    seven = plans.model_config("7B/16", "bfloat16")
    assert seven.mlp_type == "swiglu" and 6.6e9 < seven.param_count() < 6.8e9  # DINOv3 ViT-7B's 6.7e9
    assert plans.model_config("So400m/14", "bfloat16").image_size == (224, 224)
    gib = 2**30
    record = {"model": "g/14", "device": "TPU v5 lite", "batch": 32, "remat": True, "fits": False}
    record |= {"parameters_bytes": 4 * gib, "optimizer_state_bytes": 8 * gib, "activations_bytes": gib // 2}
    record |= {"temporaries_bytes": 6 * gib, "total_bytes": 18.5 * gib, "device_memory_bytes": 16 * gib}
    row = plans.table([record]).splitlines()[-1]
    assert row == "| g/14 | TPU v5 lite | 32 | on | 4.00 | 8.00 | 0.50 | 6.00 | 18.50 | 16.00 | no |"
