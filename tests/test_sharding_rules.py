"""The mesh spec and the sharding rules as text (``vit_common.training.sharding``), framework-free: what
each form parses to, the specs a rule table gives a ViT's parameters, and every refusal's one line."""

from __future__ import annotations

import pytest

from vit_common.training.sharding import Rule, mesh_sizes, parse_rules, partition
from vit_common.training.train_config import TrainConfig

SHAPES = {  # a ViT's parameters by name, as the JAX twin's state names them (width 32, 3 classes)
    "blocks.0.attn.qkv.kernel": (32, 96),
    "blocks.0.attn.qkv.bias": (96,),
    "blocks.0.mlp.fc2.kernel": (64, 32),
    "cls_token": (1, 1, 32),
    "head.kernel": (32, 3),
    "head.bias": (3,),
    "patch_embed.proj.kernel": (4, 4, 1, 32),
}


@pytest.mark.parametrize(
    "text, count, sizes",
    [
        ("replica=2,fsdp=4", 8, {"replica": 2, "fsdp": 4}),
        ("fsdp=8", 8, {"replica": 1, "fsdp": 8}),
        ("replica=-1,fsdp=1", 8, {"replica": 8, "fsdp": 1}),
        ("fsdp = 2 , replica=-1", 8, {"replica": 4, "fsdp": 2}),
        ("replica=1,fsdp=-1", 1, {"replica": 1, "fsdp": 1}),
    ],
)
def test_mesh_specs_resolve_for_the_device_count(text, count, sizes):
    assert mesh_sizes(text, count) == sizes


@pytest.mark.parametrize(
    "text, count, message",
    [
        ("replica=2,fsdp=4", 4, r"mesh=.replica=2,fsdp=4.: expected sizes whose product is the device count, 4 .* 8"),
        ("replica=3,fsdp=-1", 8, r"mesh='replica=3,fsdp=-1': expected sizes that divide the device count, 8 .* not 3"),
        ("replica=2,model=4", 8, r"mesh='replica=2,model=4': expected replica=R,fsdp=F .*, not 'model=4'"),
        ("replica=2,replica=4", 8, r"expected each axis once, 'replica' is named twice"),
        ("replica=0,fsdp=8", 8, r"expected replica's size to be an int >= 1 or -1, not '0'"),
        ("replica=-1,fsdp=-1", 8, r"expected at most one size -1"),
        ("replica", 8, r"expected replica=R,fsdp=F .*, not 'replica'"),
    ],
)
def test_bad_mesh_specs_are_one_line(text, count, message):
    with pytest.raises(ValueError, match=message) as e:
        mesh_sizes(text, count)
    assert "\n" not in str(e.value)


def test_rules_parse_in_order_with_per_dimension_axes():
    rules = parse_rules(r"blocks\..*\.kernel=.,fsdp; head\..*=replicated;.*(?=bias)bias=replica+fsdp;.*=largest")
    assert rules == (
        Rule(r"blocks\..*\.kernel", (None, ("fsdp",))),
        Rule(r"head\..*", "replicated"),
        Rule(".*(?=bias)bias", (("replica", "fsdp"),)),  # a regex may hold '=': the last one splits
        Rule(".*", "largest"),
    )
    assert str(rules[0]) == r"blocks\..*\.kernel=.,fsdp" and str(rules[2]) == ".*(?=bias)bias=replica+fsdp"


def test_the_default_table_splits_each_parameters_largest_dimension_fsdp_divides():
    specs = partition(parse_rules(TrainConfig().shard_rules), SHAPES, {"replica": 2, "fsdp": 4})
    assert specs == {
        "blocks.0.attn.qkv.kernel": (None, "fsdp"),
        "blocks.0.attn.qkv.bias": ("fsdp",),
        "blocks.0.mlp.fc2.kernel": ("fsdp", None),
        "cls_token": (None, None, "fsdp"),
        "head.kernel": ("fsdp", None),
        "head.bias": (),  # 3 classes: no dimension 4 divides, so the tensor stays whole
        "patch_embed.proj.kernel": (None, None, None, "fsdp"),
    }
    assert all(s == () for s in partition(parse_rules(".*=largest"), SHAPES, {"replica": 8, "fsdp": 1}).values())


def test_the_first_matching_rule_decides_and_unmatched_parameters_are_replicated():
    rules = parse_rules(r"blocks\..*kernel=fsdp,.;.*qkv.*=replicated;head\.kernel=.,.")
    specs = partition(rules, SHAPES, {"replica": 1, "fsdp": 8})
    assert specs["blocks.0.attn.qkv.kernel"] == ("fsdp", None) and specs["blocks.0.mlp.fc2.kernel"] == ("fsdp", None)
    assert specs["blocks.0.attn.qkv.bias"] == () and specs["head.kernel"] == (None, None)
    assert specs["cls_token"] == specs["patch_embed.proj.kernel"] == ()


@pytest.mark.parametrize(
    "rules, message",
    [
        ("qkv=largest", r"shard_rules: 'qkv=largest' decides no parameter .* names such as blocks.0.attn.qkv.kernel"),
        (".*=largest;head.*=replicated", r"'head.\*=replicated' decides no parameter \(its regex matches none"),
        (
            r"patch_embed\.proj\.kernel=.,.,fsdp,.",
            r"splits dimension 2 of patch_embed.proj.kernel \[4, 4, 1, 32\] over fsdp \(2 devices\), which does not "
            r"divide 1",
        ),
        (r"head\.bias=replica+fsdp", r"splits dimension 0 of head.bias \[3\] over replica\+fsdp \(4 devices\)"),
        (r"head\.kernel=fsdp", r"'head\\.kernel=fsdp' gives 1 dimension\(s\), head.kernel has 2 \[32, 3\]"),
    ],
)
def test_rules_that_decide_nothing_or_do_not_fit_are_one_line(rules, message):
    with pytest.raises(ValueError, match=message):
        partition(parse_rules(rules), SHAPES, {"replica": 2, "fsdp": 2})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("shard_rules", "qkv", r"shard_rules='qkv': expected REGEX=AXES rules separated by ';', not 'qkv'"),
        ("shard_rules", ".*=largest;", r"expected REGEX=AXES rules separated by ';', not ''"),
        ("shard_rules", "(=largest", r"shard_rules='\(=largest': '\(' is no regular expression"),
        ("shard_rules", ".*=model,.", r"rule '.\*=model,.': expected per dimension '.', a mesh axis .* not 'model'"),
        ("mesh", "data=8", r"mesh='data=8': expected replica=R,fsdp=F"),
    ],
)
def test_train_config_refuses_rules_and_meshes_that_do_not_parse(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value})


def test_sharding_is_the_short_form_of_a_mesh():
    assert TrainConfig().mesh_spec() == "replica=-1,fsdp=1"
    assert TrainConfig(sharding="fsdp").mesh_spec() == "replica=1,fsdp=-1"
    assert TrainConfig(mesh="replica=2,fsdp=4").mesh_spec() == "replica=2,fsdp=4"
    with pytest.raises(ValueError, match=r"sharding='fsdp': expected no --mesh too: --mesh replaces --sharding"):
        TrainConfig(sharding="fsdp", mesh="fsdp=8")
    assert set(TrainConfig.placement()) == {"sharding", "mesh", "shard_rules"}
