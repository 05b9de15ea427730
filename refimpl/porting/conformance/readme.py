"""The README a suite carries: written for a port author who has never seen this project."""

from __future__ import annotations

__all__ = ["suite_readme"]


def suite_readme(manifest: dict) -> str:
    lines = [
        f"# Qwen3-TTS conformance suite, version {manifest['version']}",
        "",
        "Made by refimpl {refimpl}; its references agree with the official implementation {official}.".format(
            refimpl=manifest["made_by"]["refimpl"],
            official=", ".join(f"{k} {v}" for k, v in manifest["agrees_with"].items()),
        ),
        "",
        "## What to run",
        "",
        "For every case below, run your port on the case's inputs (`cases/<name>/`) with the case's options",
        "(`cases/<name>/case.json`: the keywords of the official Python API), on the checkpoint the case names",
        "(`manifest.json` `checkpoints`: copied into `checkpoints/` when the suite was made from the tiny",
        "embedded checkpoints; otherwise check the SHA-256 of your files against `weights_sha256`).",
        "",
        "## What to dump, and how to name it",
        "",
        "Write one folder per case: `RESULTS/<case name>/`, holding any of:",
        "",
        "- the case's plain outputs, each a `.npy` file named after the output (`codes.npy` int [T, 16],",
        "  `waveform.npy` float [N] at 24 kHz or `waveform.wav`, `x_vector.npy` float [D]; in a batch",
        "  `codes.0.npy`, `codes.1.npy`, ...);",
        "- any intermediate tensor under its official name (`talker.model.layers.3.mlp:0.npy`, the keys of the",
        "  reference traces), or a whole dump as one `.safetensors` or `.npz` file in the folder; a name map",
        "  (`--map`) renames your port's own names.",
        "",
        "Then grade:",
        "",
        "```",
        "refimpl conformance grade SUITE RESULTS --precision float32 --html report.html",
        "```",
        "",
        "`--precision` is what your port computes in (float64, float32, bfloat16, float16): it sets the",
        "tolerance. Every tensor is compared with the float64 reference; `reference.float32.safetensors` is",
        "refimpl's own float32 run, for a closer look. Exit status 0: every case run passes; 1: one fails;",
        "2: the suite or the results cannot be used. Cases without a folder are reported as not run.",
        "",
        "## Behaviours a port may choose",
        "",
    ]
    for name, choices in manifest["behaviours"].items():
        default = next(iter(choices))
        for choice, text in choices.items():
            mark = " (default)" if choice == default else ""
            lines.append(f"- `--behaviour {name}={choice}`{mark}: {text}")
    lines += [
        "",
        "## Tolerances",
        "",
        "The allowed max |port - reference| of a tensor, as a fraction of max(1, max |reference|), for the",
        f"official model's float32 noise measured on {manifest.get('noise', 'tiny')} checkpoints; codes must be equal.",
        "",
        "| precision | " + " | ".join(sorted({n for t in manifest["tolerances"].values() for n in t})) + " |",
    ]
    nets = sorted({n for t in manifest["tolerances"].values() for n in t})
    lines.append("|---" * (len(nets) + 1) + "|")
    for precision, table in manifest["tolerances"].items():
        cells = [f"{table[n]:.3g}" if n in table else "" for n in nets]
        lines.append(f"| {precision} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## The cases",
        "",
        "| case | stage | checkpoint | outputs | what it pins down |",
        "|---|---|---|---|---|",
    ]
    for case in manifest["cases"]:
        outputs = ", ".join(f"`{o}`" for o in case["outputs"])
        lines.append(
            f"| `{case['name']}` | {case['stage']} | {case['checkpoint']} | {outputs} | {case['title']}: "
            f"{case['covers']} |"
        )
    return "\n".join(lines) + "\n"
