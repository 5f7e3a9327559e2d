"""``vit train-parity``'s printed table (``vit_compare.training.format_table``): its header names the bound
the verdict holds each column to, and the line above the columns what each is measured against."""

from __future__ import annotations

from vit_compare.training import StepRow, TrainParity, format_table

MEASURES = (
    "params, mu, nu: max|JAX - torch| / max|torch| of the worst tensor; update: max|JAX - torch| / max|torch - step 0|"
)


def _row(params: float, update: float, ref=None) -> StepRow:
    return StepRow(
        1, (2.5, 2.5), (1.0, 1.0), (0.01, 0.01), params, "blocks.0.mlp.fc1.weight", 3e-12, "fc1", 4e-12, "fc1",
        ref=ref, update=update, update_worst="blocks.0.mlp.fc1.weight",
    )  # fmt: skip


def test_a_float64_table_names_the_update_bound_the_verdict_holds():
    """A float64 run whose params column (1.13e-10) is above the moments' bound (1e-10) and whose update
    (2e-9) is within its own (1e-8): the header says update is held to 1e-8, params not at all; verdict ok.
    An update of 2e-8 fails the step."""
    result = TrainParity("float64", ("twins", "twins"), ("rel", 1e-10), [_row(1.13e-10, 2e-9)], update_bound=1e-8)
    lines = format_table(result).splitlines()
    assert lines[0] == (
        "JAX (twins) vs torch (twins), float64; the verdict holds update to rel 1e-08, mu, nu to rel 1e-10 "
        "(params: shown, not held)"
    )
    assert lines[1] == MEASURES
    assert lines[3].split()[5:9] == ["1.13e-10", "2.00e-09", "3.00e-12", "4.00e-12"]
    assert lines[-1] == "verdict: ok"
    result.rows = [_row(1.13e-10, 2e-8)]
    assert format_table(result).splitlines()[-1] == "verdict: the twins part at step 1"


def test_float32_and_reference_tables_name_their_bounds():
    """Without an update bound (float32) the verdict holds params, mu and nu to the bound; with a float64
    reference run (bfloat16 compute) it holds the ref columns alone."""
    f32 = TrainParity("float32", ("twins", "timm"), ("rel", 1e-2), [_row(5e-3, 0.5)])
    assert format_table(f32).splitlines()[0] == (
        "JAX (twins) vs torch (timm), float32; the verdict holds params, mu, nu to rel 1e-02"
    )
    ref = TrainParity("bfloat16", ("twins", "twins"), ("rel", 5e-2), [_row(0.3, 0.9, ref=(1e-2, 2e-2))])
    lines = format_table(ref).splitlines()
    assert lines[0].endswith("; the verdict holds ref to rel 5e-02 (params, mu, nu: shown, not held)")
    assert lines[2].endswith("; ref: ||JAX - f64||, ||torch - f64|| / ||f64||") and lines[-1] == "verdict: ok"
