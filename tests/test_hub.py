"""Hub model ids (``hf-hub:ORG/NAME``) as checkpoint sources, resolved through huggingface_hub's own cache
(vit_common.checkpoints.hub). No network: the cache is built by the test in huggingface_hub's layout
(checked by huggingface_hub's ``scan_cache_dir``) and the hub is switched off."""

from __future__ import annotations

import json

import huggingface_hub
import numpy as np
import pytest
from huggingface_hub import constants

from vit_cli.main import main
from vit_common.checkpoints.convert import load_checkpoint, needs, save_checkpoint
from vit_common.checkpoints.formats.errors import FormatError
from vit_common.checkpoints.hub import is_hub_id, parse_hub_id, resolve


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """huggingface_hub with its cache in tmp_path and outgoing traffic disabled (HF_HUB_OFFLINE)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def hf_repo(tmp_path, small_cfg, random_state):
    """An HF ViT folder (our writer) of small_cfg, and its canonical state."""
    state = random_state(small_cfg, seed=3)
    save_checkpoint(tmp_path / "repo", small_cfg, state, "hf")
    return tmp_path / "repo", state


def test_ids_parse_as_timm_spells_them():
    assert parse_hub_id("hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k") == (
        "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
        None,
    )
    assert parse_hub_id("hf-hub:google/siglip-base-patch16-224@v1.0") == ("google/siglip-base-patch16-224", "v1.0")
    assert is_hub_id("hf-hub:a/b") and not is_hub_id("a/b") and not is_hub_id("B/16")
    for bad in ("hf-hub:", "hf-hub:name", "hf-hub:a/b/c", "hf-hub:a/b@", "hf-hub:../b", "hf-hub:a b/c"):
        with pytest.raises(FormatError, match="expected a hub model id hf-hub:ORG/NAME"):
            parse_hub_id(bad)


def test_the_cache_the_tests_build_is_huggingface_hubs_layout(tmp_path, hf_repo, hub_cache):
    folder, _ = hf_repo
    snapshot = hub_cache(tmp_path / "hub", "org/tiny-vit", folder)
    info = huggingface_hub.scan_cache_dir(tmp_path / "hub")
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == "org/tiny-vit" and repo.repo_type == "model"
    (rev,) = repo.revisions
    assert rev.commit_hash == snapshot.name and rev.refs == frozenset({"main"})
    assert {f.file_name: f.size_on_disk for f in rev.files} == {p.name: p.stat().st_size for p in folder.iterdir()}
    got = huggingface_hub.try_to_load_from_cache("org/tiny-vit", "config.json", cache_dir=tmp_path / "hub")
    assert got == str(snapshot / "config.json")


def test_an_id_resolves_to_its_cached_snapshot_and_loads(offline_cache, hf_repo, hub_cache, small_cfg):
    folder, state = hf_repo
    snapshot = hub_cache(offline_cache, "org/tiny-vit", folder)
    assert resolve("hf-hub:org/tiny-vit") == snapshot
    assert resolve("hf-hub:org/tiny-vit", local_files_only=True, cache_dir=offline_cache) == snapshot
    assert resolve("some/path") == type(snapshot)("some/path")  # a path is a path
    assert needs("hf-hub:org/tiny-vit") is None
    ckpt = load_checkpoint("hf-hub:org/tiny-vit")
    assert ckpt.report.source == "hf-hub:org/tiny-vit" and ckpt.report.format == "hf"
    assert ckpt.cfg.replace(posemb_resample="bilinear") == small_cfg.replace(posemb_resample="bilinear")
    for k, v in state.items():
        assert np.array_equal(ckpt.state[k], v), k


def test_a_revision_resolves_to_its_own_snapshot(offline_cache, tmp_path, small_cfg, random_state, hub_cache):
    for rev, seed in (("main", 1), ("v2", 2)):
        save_checkpoint(tmp_path / rev, small_cfg, random_state(small_cfg, seed=seed), "hf")
        hub_cache(offline_cache, "org/tiny-vit", tmp_path / rev, revision=rev)
    main = load_checkpoint("hf-hub:org/tiny-vit").state["cls_token"]
    v2 = load_checkpoint("hf-hub:org/tiny-vit@v2").state["cls_token"]
    assert np.array_equal(main, random_state(small_cfg, seed=1)["cls_token"])
    assert np.array_equal(v2, random_state(small_cfg, seed=2)["cls_token"])


def test_an_id_neither_cached_nor_reachable_is_one_line(offline_cache):
    for kwargs in ({}, {"local_files_only": True}):
        with pytest.raises(FormatError) as e:
            resolve("hf-hub:org/absent", **kwargs)
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith("hf-hub:org/absent: not in the Hugging Face cache (")
        assert str(offline_cache) in msg and "download it once online" in msg


def test_vit_info_reads_an_id_and_says_in_one_line_when_it_is_not_cached(offline_cache, hf_repo, hub_cache, capsys):
    hub_cache(offline_cache, "org/tiny-vit", hf_repo[0])
    assert main(["info", "hf-hub:org/tiny-vit", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "hf-hub:org/tiny-vit" and out["format"] == "hf" and out["assumed"] == []
    assert main(["info", "hf-hub:org/absent"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert line.startswith("vit info: error: hf-hub:org/absent: not in the Hugging Face cache (")
