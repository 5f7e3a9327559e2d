"""`vit train` on bad input: exit code 2 and a one-line reason, before any training starts."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest

from vit_cli.main import build_parser, main

TINY = (
    "--image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4 "
    "--epochs 1 --no-progress --no-parity"
).split()


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such folder"),
        ("empty", "is empty"),
        ("one_class", "one class only"),
        ("corrupt", "b/1.gif"),
        ("patch", "not a multiple of patch_size"),
        ("dataset", "expected mnist5k"),
        ("batch", "--batch-size: '0': expected an integer in [1, "),
        ("timeout", "--heartbeat-timeout: '0': expected an integer in [1, "),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(case, message, tmp_path, capsys, image_folder):
    out = tmp_path / "run"
    data = {
        "missing": tmp_path / "nowhere",
        "empty": tmp_path / "empty",
        "one_class": image_folder(tmp_path / "one", ["a"]),
        "corrupt": image_folder(tmp_path / "bad", ["a", "b"], corrupt="b/1.gif"),
    }
    (tmp_path / "empty" / "a").mkdir(parents=True)
    args = [
        "train",
        *TINY,
        "--out",
        str(out),
        "--dataset",
        f"imagefolder:{data.get(case, image_folder(tmp_path / 'ok', 'xy'))}",
    ]
    if case == "patch":
        args += ["--image-size", "10"]
    if case == "dataset":
        args += ["--dataset", "cifar10"]
    if case == "batch":
        args += ["--batch-size", "0"]
    if case == "timeout":
        args += ["--heartbeat-timeout", "0"]
    try:
        rc = main(args)
    except SystemExit as e:  # a flag refused by argparse, after its usage line
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and "vit train: error: " in err and message in err, err
    assert not out.exists()  # nothing written


def test_help_explains_every_flag():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("train", "evaluate", "predict"):
        for action in sub.choices[name]._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)


@pytest.fixture
def tiny_checkpoint(tmp_path, random_state, tiny_cfg):
    """Our file of a tiny ViT: 8 px, patch 4, width 16, 3 classes, RGB."""
    from vit_common.checkpoints.convert import save_checkpoint

    cfg = tiny_cfg
    save_checkpoint(tmp_path / "ckpt.safetensors", cfg, random_state(cfg), "canonical")
    return tmp_path / "ckpt.safetensors"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--variant", "Ti/16"], "is not the model asked for: width=192, the checkpoint has width=16"),
        (["--width", "32"], "is not the model asked for: width=32, the checkpoint has width=16"),
        (["--image-size", "10"], "image_size=(10, 10) is not a multiple of patch_size=(4, 4)"),
        (["--freeze", "--layer-decay", "0.7"], "freeze=True with layer_decay=0.7"),
        (["--init", "nowhere.safetensors"], "nowhere.safetensors: no such file"),
    ],
)
def test_bad_fine_tuning_input_exits_2_naming_the_value(
    tiny_checkpoint, tmp_path, capsys, extra, message, image_folder
):
    out = tmp_path / "run"
    data = image_folder(tmp_path / "imgs", "xy")
    args = ["train", "--dataset", f"imagefolder:{data}", "--init", str(tiny_checkpoint), "--out", str(out)]
    assert main([*args, "--batch-size", "4", "--epochs", "1", "--no-progress", "--no-parity", *extra]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("vit train: error: ") and message in last, last
    assert not out.exists()


def test_freeze_needs_a_checkpoint(capsys):
    assert main(["train", "--freeze", "--dataset", "digits"]) == 2
    assert "freeze=True: expected --init too" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "width=64"], "--set width: use --width"),
        (["--set", "class_token=false"], "--set class_token: use --class-token / --no-class-token"),
        (["--set", "gelu=tanh"], "--set gelu: use --gelu"),
        (["--set", "in_chans=3"], "--set in_chans: use --dataset (its channels)"),
        (["--strict"], "--source-image-size and --strict describe the checkpoint of --init"),
        (["--source-image-size", "224"], "--source-image-size and --strict describe the checkpoint of --init"),
    ],
)
def test_checkpoint_flags_without_a_checkpoint_are_refused(extra, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "digits", *TINY, "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_model_flags_configure_the_new_model(tmp_path):
    """From scratch, the flags made from ViTConfig fields set the model (not silently ignored), and --set
    the one field without a flag."""
    import json

    out = tmp_path / "run"
    flags = ["--gelu", "tanh", "--ln-eps", "1e-5", "--dynamic-img-pad", "--qk-norm", "--reg-tokens", "2"]
    flags += ["--pool", "map", "--no-qkv-bias", "--set", "param_dtype=float32"]
    assert main(["train", "--dataset", "digits", *TINY, "--image-size", "10", "--out", str(out), *flags]) == 0
    model = json.loads((out / "config.json").read_text())["model"]
    got = [model[k] for k in ("gelu", "ln_eps", "dynamic_img_pad", "image_size", "qk_norm", "reg_tokens", "pool")]
    assert got == ["tanh", 1e-5, True, [10, 10], True, 2, "map"]
    assert (model["qkv_bias"], model["class_token"], model["posemb_prefix"]) == (False, False, True)


def test_model_flags_come_from_the_config_fields():
    """Every ViTConfig field but the dataset's (classes, channels) and the parameter dtype is a `vit train`
    flag carrying the field's help and choices; none is set unless given."""
    import dataclasses

    from vit_common.config import ViTConfig

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in sub.choices["train"]._actions}
    args = parser.parse_args(["train"])
    for f in dataclasses.fields(ViTConfig):
        if f.name in ("num_classes", "in_chans", "param_dtype"):
            assert f.name not in actions, f.name
            continue
        assert f.metadata["help"] in actions[f.name].help and getattr(args, f.name) is None, f.name
        if f.name != "dtype":
            assert actions[f.name].choices == f.metadata.get("choices"), f.name
    assert actions["pool"].choices == ("token", "gap", "max", "avgmax", "map", "token_gap", "probe", "summary", "none")
    assert actions["dtype"].choices == ("float32", "bfloat16")


@pytest.mark.slow
def test_a_warmup_as_long_as_the_run_is_warned(tmp_path, capsys, image_folder):
    data = image_folder(tmp_path / "imgs", "xy", n=6)  # 10 training images: 3 steps of 4
    assert main(["train", "--dataset", f"imagefolder:{data}", *TINY, "--out", str(tmp_path / "run")]) == 0
    assert "--warmup-steps 300 is not below the run's 3 steps" in capsys.readouterr().err


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_before_training_stops_at_once_with_one_line_and_releases_the_folder(
    tmp_path, capsys, monkeypatch, signame
):
    import signal

    import vit_jax.launch

    def interrupted(*args):
        os.kill(os.getpid(), getattr(signal, signame))  # while the data is read, say

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    monkeypatch.setattr(vit_jax.launch, "train", interrupted)
    assert main(["train", "--dataset", "digits", *TINY, "--out", str(tmp_path / "run")]) == 3
    err = capsys.readouterr().err
    assert err == f"vit train: stopped by {signame} before training began; the same command starts it again\n"
    assert not (tmp_path / "run").exists()  # the lock released, the folder it made removed
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers it replaced are back


def test_train_flags_come_from_the_config_fields():
    """Every TrainConfig, RunOptions and Augment field is a `vit train` flag with the field's help and
    default."""
    import dataclasses

    from vit_common.data.augment import Augment
    from vit_common.training.train_config import RunOptions, TrainConfig

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in sub.choices["train"]._actions}
    for cls in (TrainConfig, RunOptions, Augment):
        for f in dataclasses.fields(cls):
            if f.name == "augment":
                continue
            if "flag" in f.metadata:  # a flag of its own spelling sets it (--eval-every N|Nsteps)
                assert any(f.metadata["flag"] in a.option_strings for a in actions.values()), f.name
                continue
            assert f.metadata["help"] in actions[f.name].help, f.name
            if cls is not Augment:
                assert actions[f.name].default == f.default, f.name
    assert parser.parse_args(["train", "--no-progress", "--keep", "5"]).progress is False
    args = parser.parse_args(["train", "--dataset", "imagefolder:x", "--shift", "3"])
    from vit_cli.train import train_config

    tcfg = train_config(args)
    assert tcfg.augment == Augment(crop_scale=0.08, shift=3, flip=True) and tcfg == dataclasses.replace(
        TrainConfig(), dataset="imagefolder:x", augment=tcfg.augment
    )


def test_a_head_follows_the_class_names():
    """--init with the dataset's class count: the head is kept for the same names, its rows reordered for
    the same names in another order, replaced by zeros for other names (each change reported)."""
    from vit_common.checkpoints.formats.provenance import Report
    from vit_jax.finetune import match_head

    state = {"head.weight": np.arange(6.0).reshape(3, 2), "head.bias": np.arange(3.0)}
    report = Report()
    assert match_head(state, ("a", "b", "c"), ("a", "b", "c"), report) is state and not report.notes
    moved = match_head(state, ("a", "b", "c"), ("c", "a", "b"), report)
    np.testing.assert_array_equal(moved["head.bias"], [2.0, 0.0, 1.0])
    np.testing.assert_array_equal(moved["head.weight"][0], [4.0, 5.0])
    fresh = match_head(state, ("a", "b", "c"), ("x", "y", "z"), report)
    assert not fresh["head.weight"].any() and not fresh["head.bias"].any()
    assert "reordered" in report.notes[0] and "zero-initialised" in report.notes[1]


@pytest.mark.slow
def test_resume_drops_a_cut_metrics_line_and_falls_back_from_a_damaged_checkpoint(tmp_path, capsys):
    """A kill cut the last metrics line and a full disk truncated the latest checkpoint's files: --resume
    continues from the checkpoint before it, and ends with the uninterrupted run's weights, bit for bit."""
    from safetensors.numpy import load_file

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (16, 8, 8), np.uint8), y=np.arange(16) % 2)
    out = tmp_path / "run"
    args = [
        *"train --image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4".split(),
        *"--epochs 1 --no-progress --no-parity --compile-cache off --ckpt-every 1 --keep 5 --log-every 1".split(),
        *["--dataset", f"npz:{tmp_path / 'd.npz'}", "--out", str(out)],
    ]
    assert main(args) == 0
    done = load_file(out / "model.safetensors")
    for f in (out / "checkpoints" / "3").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    lines = (out / "metrics.jsonl").read_text().splitlines()
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 4, "loss": 0.6')  # a line a kill cut
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"vit train: warning: {out / 'checkpoints'}/3: does not restore (" in err
    again = load_file(out / "model.safetensors")
    assert all(np.array_equal(again[k], done[k]) for k in done)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]  # step 3 again, once; the cut line gone
    assert rows[:3] == [json.loads(ln) for ln in lines[:3]]


def test_a_metrics_line_without_a_step_names_the_file_and_line(tmp_path):
    from vit_jax.loop import _truncate_metrics

    (tmp_path / "m.jsonl").write_text('{"step": 1}\n{"loss": 2}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2: a metrics line without an integer 'step'"):
        _truncate_metrics(tmp_path / "m.jsonl", 3)
    (tmp_path / "m.jsonl").write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2: not readable JSON"):
        _truncate_metrics(tmp_path / "m.jsonl", 3)


@pytest.mark.slow
def test_an_unusable_compilation_cache_is_a_warning_and_the_run_goes_on_uncached(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (10, 8, 8), np.uint8), y=np.arange(10) % 2)
    (tmp_path / "cache").write_text("a file where the cache folder would be\n")
    args = [
        *"train --image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4".split(),
        *["--epochs", "1", "--no-progress", "--no-parity", "--json", "--compile-cache", str(tmp_path / "cache")],
        *["--dataset", f"npz:{tmp_path / 'd.npz'}", "--out", str(tmp_path / "run")],
    ]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert f"vit train: warning: compilation cache unusable ({tmp_path / 'cache'}: cannot be made (" in err
    assert json.loads(out)["steps"] == 2 and (tmp_path / "cache").read_text().startswith("a file")


def test_a_resumed_fine_tuning_exports_as_the_first_run_did(tmp_path, random_state, tiny_cfg):
    """A resume reads no checkpoint: the run's config.json keeps what the exports need of it (the model
    type that makes a SigLIP classifier written as itself, the layout that names a timm entry point), and
    an export folder the first run wrote (a timm hub folder's model_timm/) is written again."""
    from vit_common.checkpoints.convert import save_checkpoint
    from vit_common.checkpoints.formats.provenance import Report
    from vit_common.data.datasets import ArraySource, Dataset
    from vit_jax.finetune import check_exports, init_record, resumed_init

    cfg = tiny_cfg
    save_checkpoint(tmp_path / "hub", cfg, random_state(cfg), "timm")
    report = Report(source=str(tmp_path / "hub"), format="timm", assumed=[], config=cfg, layout="L", model_type="M")
    saved = json.loads(json.dumps({"model": cfg.to_dict(), "preprocess": {}, "init": init_record(report)}))
    rng = np.random.default_rng(0)
    src = ArraySource(rng.integers(0, 256, (4, 8, 8, 3), np.uint8), np.arange(4) % 2)
    data = Dataset("d", src, src, ("a", "b"), (8, 8), 3)
    back = resumed_init(saved, data).report
    assert (back.source, back.format, back.model_type, back.layout) == (str(tmp_path / "hub"), "timm", "M", "L")
    out = tmp_path / "run"
    save_checkpoint(out / "model_timm", cfg, random_state(cfg), "timm")  # the first run's export
    check_exports(out, cfg, back)  # was: "model_timm is a folder: expected a file path"


@pytest.mark.slow
def test_a_resumed_fine_tuning_needs_its_init_file_no_more(tmp_path, capsys, random_state, tiny_cfg):
    """Fine-tune a timm .safetensors with checkpoints, delete it, then --resume with one epoch more: the run
    folder's config.json and checkpoint hold everything, and the export is in the source's format again."""
    from safetensors.numpy import load_file

    from vit_common.checkpoints.convert import save_checkpoint

    cfg = tiny_cfg
    save_checkpoint(tmp_path / "src.safetensors", cfg, random_state(cfg), "timm")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (16, 8, 8, 3), np.uint8), y=np.arange(16) % 2)
    out = tmp_path / "run"
    args = [
        *["train", "--init", str(tmp_path / "src.safetensors"), "--dataset", f"npz:{tmp_path / 'd.npz'}"],
        *["--out", str(out), "--batch-size", "4", "--no-progress", "--no-parity", "--compile-cache", "off"],
        *["--ckpt-every", "1", "--json"],
    ]
    assert main([*args, "--epochs", "1"]) == 0
    first = json.loads(capsys.readouterr().out)
    init = json.loads((out / "config.json").read_text())["init"]
    assert (init["source"], init["format"], init["assumed"], init["model_type"]) == (
        str(tmp_path / "src.safetensors"),
        "timm",
        [],
        "",
    )
    (tmp_path / "src.safetensors").unlink()
    assert main([*args, "--epochs", "2", "--resume"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["start"], summary["steps"]) == (first["steps"], 2 * first["steps"])
    assert summary["exports"] == {"timm": str(out / "model_timm.safetensors")}
    back, ours = load_file(out / "model_timm.safetensors"), load_file(out / "model.safetensors")
    assert set(back) == set(ours) and all(back[k].tobytes() == ours[k].tobytes() for k in ours)


@pytest.mark.slow
def test_ema_resumes_bit_exactly_and_export_ema_exports_it_leaving_the_training_as_it_was(tmp_path, capsys):
    """--ema 0.5 --export-ema with a checkpoint a step (3 steps), the last removed, then --resume: the same exports
    and EMA metrics, bit for bit. The last checkpoint's EMA (restored by a Trainer of config.json) is what
    model.safetensors holds; its raw weights are those of the same run without --ema (the default keeps
    today's numbers)."""
    import shutil

    from safetensors.numpy import load_file

    from vit_common.config import ViTConfig
    from vit_common.data.augment import Augment
    from vit_common.data.datasets import read_dataset
    from vit_common.training.train_config import TrainConfig
    from vit_jax.checkpointing import Checkpoints
    from vit_jax.trainer import Trainer, sharded_abstract

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.integers(0, 256, (16, 8, 8), np.uint8), y=np.arange(16) % 2)
    base = [
        *"train --image-size 8 --patch-size 4 --width 16 --depth 1 --num-heads 2 --mlp-dim 32 --batch-size 4".split(),
        *"--epochs 1 --no-progress --no-parity --compile-cache off --ckpt-every 1 --keep 5 --lr 0.01".split(),
        *["--dataset", f"npz:{tmp_path / 'd.npz'}"],
    ]
    plain, run = tmp_path / "plain", tmp_path / "ema"
    assert main([*base, "--out", str(plain)]) == 0
    args = [*base, "--out", str(run), "--ema", "0.5", "--export-ema"]
    assert main(args) == 0
    assert "the exports hold the EMA weights (decay 0.5)\n" in capsys.readouterr().out
    done, evals = load_file(run / "model.safetensors"), (run / "metrics.jsonl").read_text().splitlines()[-1]
    shutil.rmtree(run / "checkpoints" / "3")  # the last: the resume runs step 3 again
    assert main([*args, "--resume"]) == 0
    again = load_file(run / "model.safetensors")
    assert all(np.array_equal(again[k], done[k]) for k in done)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last == json.loads(evals) and {"test_ema_loss", "test_ema_accuracy"} <= set(last)
    config = json.loads((run / "config.json").read_text())
    assert config["exports"] == {"weights": "ema"} and config["train"]["ema"] == 0.5
    cfg = ViTConfig.from_dict(config["model"])
    tcfg = TrainConfig(**{**config["train"], "augment": Augment(**config["train"]["augment"])})
    t = Trainer(cfg, tcfg, read_dataset(f"npz:{tmp_path / 'd.npz'}").fit(cfg.image_size, cfg.in_chans))
    ckpts = Checkpoints(run / "checkpoints")
    state, _ = ckpts.restore(sharded_abstract(t))
    ckpts.close()
    averaged, raw, trained = t.weights(state, ema=True), t.weights(state), load_file(plain / "model.safetensors")
    assert int(state["step"]) == 3 and all(np.array_equal(averaged[k], done[k]) for k in done)
    assert all(np.array_equal(raw[k], trained[k]) for k in trained)
    assert max(float(np.abs(raw[k] - done[k]).max()) for k in done) > 1e-4  # the exports are not the raw weights


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--ema", "0"], "argument --ema: '0': expected a finite number in (0, 1)"),
        (["--ema", "1"], "argument --ema: '1': expected a finite number in (0, 1)"),
        (["--ema", "0.9", "--ema-min-decay", "1"], "argument --ema-min-decay: '1': expected a finite number in [0, 1)"),
    ],
)
def test_a_bad_ema_decay_is_a_usage_error(extra, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *TINY, *extra])
    assert e.value.code == 2 and f"vit train: error: {message}" in capsys.readouterr().err


@pytest.mark.slow
def test_export_ema_without_ema_exits_2_with_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--dataset", "digits", "--out", str(out), "--export-ema"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        err[-1]
        == "vit train: error: --export-ema: this run keeps no moving average of the weights; pass --ema DECAY too"
    )
    assert not out.exists()
