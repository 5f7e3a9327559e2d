"""Entry point of the `vit` command: dispatches to one module per subcommand.

Exit codes: 0 success, 1 a check failed (e.g. parity beyond tolerance), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import time

from vit_common.system import io
from vit_common.system.extras import install_hint
from vit_common.system.host_memory import reuse_freed_memory

# subcommand -> module; each module imports only argparse/stdlib/vit_common at top level.
COMMANDS = {
    "info": "vit_cli.info",
    "convert": "vit_cli.convert",
    "parity": "vit_cli.parity",
    "attention": "vit_cli.attention",
    "train": "vit_cli.train",
    "train-parity": "vit_cli.train_parity",
    "recipes": "vit_cli.recipes",
    "evaluate": "vit_cli.evaluate",
    "predict": "vit_cli.predict",
    "bench": "vit_cli.bench",
    "data": "vit_cli.data",
}
# commands that write files
WRITING = ("convert", "parity", "attention", "train", "train-parity", "evaluate", "bench", "data")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" to a flag's help unless X is None (the help text then says what applies)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


# Top-level module -> the extra that installs it (pyproject.toml), for a one-line message when it is missing.
EXTRAS = {
    **dict.fromkeys(("jax", "jaxlib", "flax", "optax", "orbax", "grain", "tensorboardX"), "jax"),
    "torch": "torch",
    **dict.fromkeys(("PIL", "mlxtend", "sklearn"), "data"),
    **dict.fromkeys(("datasets", "pyarrow", "array_record"), "datasets"),
    "peft": "lora",
    **dict.fromkeys(("timm", "transformers", "torchvision", "skimage"), "dev"),
}


def missing_extra(e: ModuleNotFoundError) -> str | None:
    """The one-line advice for a missing optional dependency, or None if ``e`` is not about one."""
    top = (e.name or "").split(".")[0]
    if top not in EXTRAS:
        return None
    return f"this needs {top}, which is not installed: {install_hint(EXTRAS[top])}"


class Parser(argparse.ArgumentParser):
    """``vit``'s parsers: a flag is its whole name (no prefix matching: ``--epoch`` is not ``--epochs``),
    and a subcommand's parser refuses what it does not know itself, naming the closest flags
    (``difflib``). A usage error prints the usage only where it is short (``SHORT_USAGE`` lines; ``vit
    train``'s is about 60), else one line pointing at ``--help``, then the error."""

    SHORT_USAGE = 4

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def parse_known_args(self, args=None, namespace=None):
        namespace, extra = super().parse_known_args(args, namespace)
        if extra and self.prog != "vit":  # a subcommand's: its own usage, a suggestion
            self.error(unknown_arguments(self, extra))
        return namespace, extra

    def error(self, message: str):
        usage = self.format_usage()
        if usage.count("\n") > self.SHORT_USAGE:
            usage = f"usage: {self.prog} [FLAGS] ... ('{self.prog} --help' lists them)\n"
        self.exit(2, f"{usage}{self.prog}: error: {message}\n")


def unknown_arguments(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """'unrecognized arguments: A B' with, for each unknown flag, the closest flags of ``parser``."""
    import difflib

    flags = [f for f in parser._option_string_actions if f.startswith("--")]
    hints = []
    for word in (w.split("=", 1)[0] for w in extra if w.startswith("--")):
        close = difflib.get_close_matches(word, flags, n=3, cutoff=0.8)
        if close:
            hints.append(f"{word}: did you mean {' or '.join(close)}?")
    return f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else "")


def version() -> str:
    """The installed vit-twins version (pyproject.toml's, through the package metadata)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("vit-twins")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . in a checkout of vit-twins)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="vit", description="One Vision Transformer in JAX and PyTorch, proven equal.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    for name in WRITING:
        sub.choices[name].add_argument(
            "--overwrite",
            action="store_true",
            help="replace existing files that vit cannot tell it wrote (without it they are refused); "
            "a folder holding files vit did not write is never replaced",
        )
    return parser


def _weights_entry(args: argparse.Namespace):
    """The ``--weights-entry`` of a command that reads checkpoints, around the whole command."""
    import contextlib

    if getattr(args, "weights_entry", None) is None:
        return contextlib.nullcontext()
    from vit_common.checkpoints.formats.source import weights_entry

    return weights_entry(args.weights_entry)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.started = started  # `time.perf_counter()` when the command started
    reuse_freed_memory()  # before JAX starts its threads; see vit_common/system/host_memory.py
    try:
        with io.overwriting(getattr(args, "overwrite", False)), _weights_entry(args):
            return int(args.func(args) or 0)
    except ModuleNotFoundError as e:
        advice = missing_extra(e)
        if advice is None:
            raise
        print(f"vit {args.command}: error: {advice}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `vit info B/16 | head -1`: the reader left, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError) as e:  # bad input or an unusable path (missing, a folder, ...)
        print(f"vit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if argv is None:  # the process ends next: CPython's last collection would walk every object
            gc.freeze()  # torch, timm and JAX made (seconds); it skips frozen ones, the OS frees them


if __name__ == "__main__":
    sys.exit(main())
