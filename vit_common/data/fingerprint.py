"""What identifies the data a run trained on, and what changed since: ``Dataset.fingerprint``
(``vit_common.data.datasets``) is stored in a run's config.json and compared on resume
(``fingerprint_changes``). Up to ``FINGERPRINT_FILES`` files it lists each file with its size and
modification time; beyond, a digest per folder (``folder_digests``)."""

from __future__ import annotations


def _listed(what: str, names: list[str]) -> str:
    return f"{what} ({len(names)}): " + ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


# A fingerprint lists each file up to this many files; beyond (an ImageNet-sized image folder: 1.28
# million files would make config.json some 130 MB) it holds a digest per folder instead, so that a
# change is named by folder, and config.json stays small enough to be read back within io's JSON bound.
FINGERPRINT_FILES = 20_000


def folder_digests(files: dict[str, list[int]]) -> dict[str, list]:
    """{folder (a file's relative parent, "." at the top): [file count, SHA-256 of its "name<TAB>size"
    lines, SHA-256 of its modification times]}, each in file-name order."""
    import hashlib

    groups: dict[str, list[tuple[str, int, int]]] = {}
    for rel, (size, mtime) in sorted(files.items()):
        parent, _, name = rel.rpartition("/")
        groups.setdefault(parent or ".", []).append((name, size, mtime))
    return {
        folder: [
            len(entries),
            hashlib.sha256("".join(f"{n}\t{z}\n" for n, z, _ in entries).encode()).hexdigest(),
            hashlib.sha256("".join(f"{t}\n" for _, _, t in entries).encode()).hexdigest(),
        ]
        for folder, entries in groups.items()
    }


def _folder_changes(errors: list[str], saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """``fingerprint_changes`` of fingerprints of which one holds folder digests (``FINGERPRINT_FILES``):
    folders added, removed or whose files (names, sizes) changed are errors; folders whose files differ
    in modification times alone are a warning."""
    a, b = (fp["folders"] if "folders" in fp else folder_digests(fp.get("files", {})) for fp in (saved, now))
    errors += [
        _listed(what, names)
        for what, names in (
            ("folders added", sorted(set(b) - set(a))),
            ("folders removed", sorted(set(a) - set(b))),
            (
                "folders whose files were added, removed or resized",
                sorted(k for k in set(a) & set(b) if a[k][:2] != b[k][:2]),
            ),
        )
        if names
    ]
    if not errors and saved.get("labels") != now["labels"]:
        errors.append("labels: the same counts, but other labels or another order of them")
    touched = sorted(k for k in set(a) & set(b) if a[k][:2] == b[k][:2] and a[k][2] != b[k][2])
    warnings = [_listed("folder(s) whose files have other modification times only", touched)] if touched else []
    return errors, warnings


def fingerprint_changes(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """(errors, warnings) comparing a run's stored ``Dataset.fingerprint`` with the data's now.

    Errors (the data changed; resuming would train on other data, with another split and schedule):
    other class names, other train or test counts, other labels, files added, removed or of another
    size, each listed (the first five, with the count). Warnings: files whose size is the same but whose
    modification time is not (as after a copy to new nodes), listed alike.
    """
    errors = []
    if saved.get("classes") != now["classes"]:
        errors.append(f"classes: the run has {saved.get('classes')}, the data now {now['classes']}")
    for split in ("train", "test"):
        if saved.get(split) != now[split]:
            errors.append(f"{split} images: the run has {saved.get(split)}, the data now {now[split]}")
    if "files" not in saved or "files" not in now:  # a large dataset: compared folder by folder
        return _folder_changes(errors, saved, now)
    a, b = saved.get("files", {}), now["files"]
    errors += [
        _listed(what, names)
        for what, names in (
            ("files added", sorted(set(b) - set(a))),
            ("files removed", sorted(set(a) - set(b))),
            ("files of another size", sorted(k for k in set(a) & set(b) if a[k][0] != b[k][0])),
        )
        if names
    ]
    if not errors and saved.get("labels") != now["labels"]:  # the same files and counts, other contents
        errors.append("labels: the same counts, but other labels or another order of them")
    touched = sorted(k for k in set(a) & set(b) if a[k][0] == b[k][0] and a[k][1] != b[k][1])
    warnings = [_listed("file(s) have other modification times but the same sizes", touched)] if touched else []
    return errors, warnings
