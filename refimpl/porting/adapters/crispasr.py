"""CrispASR's qwen3-tts debug dumps read under our names, and our codes written as its replay file
(docs/ports.md).

CrispASR (GGML; its wheel is ``crispasr``) writes, when ``CRISPASR_QWEN3_TTS_DUMP_DIR`` names a folder, one
file per tensor, ``<dir>/<name>.bin``: the raw little-endian float32 values (int32 for ids and codes), no
header, so the shape comes from the name and the model's sizes. ``CRISPASR_QWEN3_TTS_DUMP_LOGITS`` names a
folder for the Talker's raw logits of every frame, before the repetition penalty and the suppress mask,
``<dir>/talker_s<synthesis:02>_<frame:04>.f32`` (float32, no header). ``CRISPASR_QWEN3_TTS_REPLAY_CODES``
names a text file of 16 whitespace-separated codes per frame that the generation uses in place of its own
picks (teacher forcing: ``write_replay_codes`` writes ours).

The names, as ``CRISPASR_NAMES`` (its file -> our key; ``H`` the Talker's width, ``V`` its vocabulary, ``Vc``
the code predictor's; ``s`` the synthesis read, ``f`` a frame):

    icl_prefill.bin                   refimpl.talker.prompt.embeds                  [T*H] -> [1, T, H]
    talker_s<s>_<f>.f32               refimpl.talker.sampling.logits:<f>            [V]   -> [1, V]
    talker_prefill_logits.bin         (frame 0 of the above: left out when equal; the last synthesis's, untagged)
    cp_f<f>_step00_logits.bin         refimpl.talker.code_predictor.sampling.logits:<15 f> [Vc] -> [1, Vc]
    cp_f<f>_step<k>_logits.bin        refimpl.talker.code_predictor.sampling.logits:<15 f + k>
    generated_codes_s<s>.bin          refimpl.codes.0                               [T*16] int32 -> [T, 16]

Every other file (the step inputs ``cp_f<f>_step<k>_embed``, the picks ``cp_f<f>_step<k>_id``, the prompt
parts ``icl_*``, ``vd_*``, ``tts_special_emb``, the token ids ``syn_ids``, ``ref_ids``, ``vd_instruct_ids``)
is kept as ``crispasr.<name>``, flat. ``teacher_forced=True`` (a run with a replay file) keeps the replayed
codes and the code predictor's steps after the first as ``crispasr.*`` too: its code predictor feeds each
step its own pick, not the replayed code, so only step 0 of a frame sees our history.

    port = read_crispasr_dump("dump/", hidden=1024, logits_dir="logits/")   # a Trace under our names
    write_replay_codes(codes, "replay.txt")                                  # our codes, for teacher forcing
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from ...io.files import InputError, read_limited, write_atomically
from ..trace_files import Trace

__all__ = ["CRISPASR_NAMES", "read_crispasr_dump", "read_crispasr_file", "write_replay_codes", "CrispasrDumpError"]

CODE_GROUPS = 16  # codes per frame in its replay file and its generated_codes dump
PREDICTOR_STEPS = CODE_GROUPS - 1  # code predictor calls per frame
CRISPASR_NAMES = {
    "icl_prefill.bin": "refimpl.talker.prompt.embeds",
    "talker_s<s>_<f>.f32": "refimpl.talker.sampling.logits:<f>",
    "cp_f<f>_step<k>_logits.bin": "refimpl.talker.code_predictor.sampling.logits:<15 f + k>",
    "generated_codes_s<s>.bin": "refimpl.codes.0",
}
INTEGER_FILES = re.compile(r"(generated_codes_s\d+|cp_f\d+_step\d+_id|syn_ids|ref_ids|vd_instruct_ids)")
LOGITS = re.compile(r"talker_s(\d{2,})_(\d{4,})")
STEP = re.compile(r"cp_f(\d{3,})_step(\d{2,})_(embed|logits|id)")
STEP_PARTS = ("embed", "logits", "id")  # the order of one code predictor step
CODES = re.compile(r"generated_codes_s(\d{2,})")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
MAX_FILE_BYTES = 1 << 30
MAX_FILES = 100_000  # a long run writes 45 files a frame


class CrispasrDumpError(InputError):
    """A file or folder that is not a CrispASR dump, or codes that cannot be written as its replay file."""


def read_crispasr_file(path: str | os.PathLike[str], dtype: str = "float32") -> np.ndarray:
    """One dump file: its raw little-endian values (``float32`` or ``int32``), flat."""
    data = read_limited(path, MAX_FILE_BYTES, f"CrispASR dump {path}", CrispasrDumpError, regular_only=True)
    if len(data) % 4:
        raise CrispasrDumpError(f"{path}: {len(data)} bytes, not a whole number of 4-byte {dtype} values")
    return np.frombuffer(data, dtype="<f4" if dtype == "float32" else "<i4").astype(dtype)


def _frames_of(name: str, a: np.ndarray, width: int) -> np.ndarray:
    if width < 1 or a.size % width or not a.size:
        raise CrispasrDumpError(f"{name}: {a.size} values, not a whole number of rows of {width}")
    return a.reshape(-1, width)


def read_crispasr_dump(
    folder: str | os.PathLike[str] | None = None,
    hidden: int | None = None,
    logits_dir: str | os.PathLike[str] | None = None,
    synthesis: int = 0,
    teacher_forced: bool = False,
) -> Trace:
    """A CrispASR dump (``folder``: its DUMP_DIR; ``logits_dir``: its DUMP_LOGITS) as a trace under our names
    (``CRISPASR_NAMES``), in execution order: the prompt, then per frame the Talker's logits and the code
    predictor's, then the codes. ``hidden``: the Talker's width, to shape the prompt (without it the prompt is
    kept flat as ``crispasr.icl_prefill``); ``synthesis``: which synthesis of the process (its file names'
    ``s<NN>``). The metadata names the files read."""
    files: list[Path] = []
    for where, suffix in ((folder, ".bin"), (logits_dir, ".f32")):
        if where is None:
            continue
        where = Path(where)
        if not where.is_dir():
            raise CrispasrDumpError(f"{where}: not a folder (CrispASR writes one {suffix} file per tensor into it)")
        found = sorted(p for p in where.iterdir() if p.suffix == suffix)
        if len(files) + len(found) > MAX_FILES:
            raise CrispasrDumpError(f"{where}: more than {MAX_FILES} {suffix} files")
        files += found
    if not files:
        raise CrispasrDumpError(f"{folder or logits_dir} holds no file of a CrispASR dump (.bin, .f32)")
    prompt: list = []
    per_frame: dict[int, list] = {}  # frame -> [(place in the frame, key, array)]
    last: list = []
    read = []
    prefill_logits = None
    for path in files:
        stem = path.stem
        if not NAME.fullmatch(stem):
            raise CrispasrDumpError(f"{path}: not a name CrispASR writes")
        m, c = LOGITS.fullmatch(stem), CODES.fullmatch(stem)
        if (m or c) and int((m or c).group(1)) != synthesis:  # type: ignore[union-attr]  # one of them matched
            continue  # another synthesis of the same process
        a = read_crispasr_file(path, "int32" if INTEGER_FILES.fullmatch(stem) else "float32")
        read.append(path.name)
        if a.dtype.kind == "i":
            a = a.astype(np.int64)
        step = STEP.fullmatch(stem)
        if m:
            frame = int(m.group(2))
            per_frame.setdefault(frame, []).append(((0, 0, 0), f"refimpl.talker.sampling.logits:{frame}", a[None]))
        elif step:
            frame, k, part = int(step.group(1)), int(step.group(2)), step.group(3)
            if not 0 <= k < PREDICTOR_STEPS:
                raise CrispasrDumpError(f"{path}: step {k}; the code predictor makes {PREDICTOR_STEPS} a frame")
            key, value = f"crispasr.{stem}", a
            if part == "logits" and not (teacher_forced and k):
                key, value = f"refimpl.talker.code_predictor.sampling.logits:{frame * PREDICTOR_STEPS + k}", a[None]
            per_frame.setdefault(frame, []).append(((1, k, STEP_PARTS.index(part)), key, value))
        elif c:
            codes = _frames_of(path.name, a, CODE_GROUPS)
            last.append(("crispasr.replayed_codes" if teacher_forced else "refimpl.codes.0", codes))
        elif stem == "icl_prefill" and hidden:
            prompt.append(("refimpl.talker.prompt.embeds", _frames_of(path.name, a, hidden)[None]))
        elif stem == "talker_prefill_logits":
            prefill_logits = a
        else:
            prompt.append((f"crispasr.{stem}", a))
    if prefill_logits is not None:
        first = next((v for _, k, v in per_frame.get(0, []) if k == "refimpl.talker.sampling.logits:0"), None)
        if first is None or not np.array_equal(first[0], prefill_logits):  # its name has no synthesis: the last one's
            prompt.append(("crispasr.talker_prefill_logits", prefill_logits))
    ordered = [(k, v) for frame in sorted(per_frame) for _, k, v in sorted(per_frame[frame], key=lambda e: e[0])]
    items = prompt + ordered + last
    meta = {"producer": "CrispASR qwen3-tts dump", "dtype": "float32", "crispasr_files": read}
    return Trace(items, meta)


def write_replay_codes(codes: ArrayLike, path: str | os.PathLike[str]) -> Path:
    """``codes`` [frames, 16] as CrispASR's replay file: one frame a line, its 16 codes separated by spaces."""
    a = np.asarray(codes)
    if a.ndim != 2 or a.shape[1] != CODE_GROUPS or a.dtype.kind not in "iu":
        what = f"codes of shape {list(a.shape)} ({a.dtype})"
        raise CrispasrDumpError(f"{what}; the replay file takes [frames, 16] integers")
    if a.size and (a.min() < 0 or a.max() >= 1 << 31):
        raise CrispasrDumpError("a replayed code must be a non-negative int32")
    text = "".join(" ".join(str(int(v)) for v in row) + "\n" for row in a)
    write_atomically(path, text.encode("ascii"))
    return Path(path)
