"""The conformance suite and its grader: our own float32 run passes every case; simulated ports with one
mistake each are named where they go wrong (first divergence, shapes in execution order, waveforms with
their frame); the suite and the results are validated."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from refimpl.codec.speech_tokenizer import SpeechTokenizer
from refimpl.porting import trace_files
from refimpl.porting.conformance import grade, suite

# soxr_optional: the suite resamples its 16 kHz case with soxr where it is installed, the fallback elsewhere
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.soxr_optional]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("conformance") / "suite"
    manifest = suite.make_suite(out)
    return out, manifest


def reference(suite_dir: Path, case: str, precision: str = "float32") -> trace_files.Trace:
    return trace_files.load_trace(suite_dir / "cases" / case / f"reference.{precision}.safetensors")


def write_outputs(results: Path, case: dict, trace: trace_files.Trace, **replace) -> Path:
    """A port that dumps only the case's plain outputs (codes.npy, waveform.npy, x_vector.npy)."""
    folder = results / case["name"]
    folder.mkdir(parents=True)
    for out, key in case["outputs"].items():
        value = replace.get(out.replace(".", "_"))
        np.save(folder / f"{out}.npy", np.squeeze(trace[key]) if value is None else value)
    return folder


def cases_of(manifest) -> dict:
    return {c["name"]: c for c in manifest["cases"]}


def test_the_suite_covers_every_network_and_mode(made):
    suite_dir, manifest = made
    names = set(cases_of(manifest))
    assert {
        "codec-decode",
        "codec-decode-chunked",
        "codec-decode-stream",
        "codec-encode",
        "codec-encode-16k",
        "speaker",
        "say-greedy",
        "say-streaming-feed",
        "say-batch",
        "say-sampled",
        "design-greedy",
        "clone-x-vector",
        "clone-icl",
    } <= names
    assert manifest["version"] == suite.SUITE_VERSION and manifest["agrees_with"]["qwen-tts"] == "0.1.1"
    assert set(manifest["tolerances"]) == {"float64", "float32", "bfloat16", "float16"}
    for kind, entry in manifest["checkpoints"].items():
        assert (suite_dir / entry["path"] / "config.json").is_file(), kind
        assert entry["weights_sha256"] == trace_files.weights_hash(suite_dir / entry["path"])
    sampled = cases_of(manifest)["say-sampled"]
    uniforms = np.load(suite_dir / "cases" / "say-sampled" / sampled["inputs"]["uniforms"])
    assert uniforms.size > 0
    np.testing.assert_array_equal(uniforms, reference(suite_dir, "say-sampled", "float64")["refimpl.random_draws"])
    streaming = reference(suite_dir, "say-streaming-feed")
    assert streaming.metadata["input"]["non_streaming_mode"] is False
    batch = reference(suite_dir, "say-batch")
    assert {"refimpl.codes.0", "refimpl.codes.1", "refimpl.waveform.0", "refimpl.waveform.1"} <= set(batch.keys)
    readme = (suite_dir / "README.md").read_text()
    assert "refimpl conformance grade" in readme and all(f"`{n}`" in readme for n in names)
    assert json.loads((suite_dir / "cases" / "clone-icl" / "case.json").read_text())["name"] == "clone-icl"


def test_each_row_of_the_batch_case_is_its_text_alone_in_codes_and_audio(made):
    """say-batch's rows against their texts traced alone, as the suite traces a case (the first text is the
    longer, unpadded; the second left-padded): the same codes and audio bit for bit in both precisions.
    (Their traces differ in a few hundred tensors: why the suite and golden corpora run each case alone,
    docs/performance.md "Batches".)"""
    suite_dir, _ = made
    case = next(c for c in suite.CASES if c.name == "say-batch")
    models = suite.Models(suite.resolve_checkpoints(None)[0])
    for precision, dtype in (("float64", np.float64), ("float32", np.float32)):
        batch = reference(suite_dir, "say-batch", precision)
        for i, text in enumerate(case.options["text"]):
            alone = suite.reference_trace(
                dataclasses.replace(case, options=dict(case.options, text=text)), models, {}, dtype
            )
            for output in ("codes", "waveform"):
                np.testing.assert_array_equal(
                    batch[f"refimpl.{output}.{i}"],
                    alone[f"refimpl.{output}.0"],
                    err_msg=f"{precision} row {i} {output}",
                )
        models.keep_only(None)


def test_our_float32_run_passes_every_case_as_traces_and_as_plain_outputs(made, tmp_path):
    suite_dir, manifest = made
    traces, plain = tmp_path / "traces", tmp_path / "plain"
    traces.mkdir()
    for case in manifest["cases"]:
        shutil.copy(
            suite_dir / "cases" / case["name"] / "reference.float32.safetensors", traces / f"{case['name']}.safetensors"
        )
        write_outputs(plain, case, reference(suite_dir, case["name"]))
    for results in (traces, plain):
        report = grade.grade_suite(suite_dir, results, "float32")
        assert [c["name"] for c in report["cases"] if c["status"] != "pass"] == [], grade.format_report(report)
        assert report["passed"] and grade.exit_status(report) == 0
    say = next(c for c in report["cases"] if c["name"] == "say-greedy")
    assert say["codes"]["frames_equal"] == say["codes"]["frames_reference"] > 0
    assert say["waveform"]["snr_db"] > 90 and say["waveform"]["first_divergent_frame"] is None
    float64 = tmp_path / "float64"
    float64.mkdir()
    for case in manifest["cases"]:
        shutil.copy(
            suite_dir / "cases" / case["name"] / "reference.float64.safetensors",
            float64 / f"{case['name']}.safetensors",
        )
    assert grade.grade_suite(suite_dir, float64, "float64")["passed"]


def graded(suite_dir, results, name, **kwargs) -> dict:
    report = grade.grade_suite(suite_dir, results, kwargs.pop("precision", "float32"), **kwargs)
    return next(c for c in report["cases"] if c["name"] == name), report


def test_a_wrong_module_is_the_first_divergence(made, tmp_path):
    """A decoder whose second layer's attention output is 1 % off: named, though later tensors fail too."""
    suite_dir, _ = made
    ref = reference(suite_dir, "codec-decode")
    wrong = "decoder.pre_transformer.layers.1.self_attn.o_proj"
    assert wrong in ref.keys
    items = [(k, v * 1.01 if k == wrong else v) for k, v in ref.items]
    trace_files.Trace(items, {}).save(tmp_path / "codec-decode.safetensors")
    case, report = graded(suite_dir, tmp_path, "codec-decode")
    assert case["status"] == "fail" and case["first_failure"] == wrong
    assert {c["name"]: c["status"] for c in case["checks"]}["decoder"] == "fail"
    assert grade.exit_status(report) == 1
    assert "codec-decode" in grade.format_report(report) and "FAIL" in grade.format_report(report)


def test_a_shape_mismatch_upstream_is_the_first_divergence(made, tmp_path):
    """An encoder stage that makes 4 more frames: its shape is the first failure, not a later tensor."""
    suite_dir, _ = made
    ref = reference(suite_dir, "codec-encode-16k")
    conv = next(k for k, v in ref.items if k.startswith("encoder.encoder.") and np.ndim(v) == 3)
    items = [(k, np.concatenate([v, v[..., -4:]], axis=-1) if k == conv else v) for k, v in ref.items]
    trace_files.Trace(items, {}).save(tmp_path / "codec-encode-16k.safetensors")
    case, _ = graded(suite_dir, tmp_path, "codec-encode-16k")
    assert case["status"] == "fail" and case["first_failure"] == conv
    first = next(t for t in case["tensors"] if t["key"] == conv)
    assert first["shape_mismatch"] is not None and "shape" in case["message"]


def test_a_waveform_says_where_it_parts(made, tmp_path):
    """A streamed decode that re-decodes each chunk with 25 frames of left context (a serving engine's bug):
    equal to the exact stream for the first frames, wrong from a later frame on; the grader names it."""
    suite_dir, manifest = made
    case = cases_of(manifest)["codec-decode-stream"]
    codes = np.load(suite_dir / "cases" / case["name"] / "codes.npy")
    tok = SpeechTokenizer.from_pretrained(suite_dir / "checkpoints" / "customvoice", dtype=np.float32)
    pieces, t = [], 0
    for n in [1, 2] + [4] * 20:
        if t >= len(codes):
            break
        start = max(0, t - 25)
        pieces.append(tok.decode_full(codes[start : t + n])[(t - start) * 1920 :])
        t += n
    wav = np.concatenate(pieces)
    folder = tmp_path / case["name"]
    folder.mkdir()
    np.save(folder / "waveform.npy", wav)
    result, _ = graded(suite_dir, tmp_path, case["name"])
    wave = result["waveform"]
    assert result["status"] == "fail"
    assert 25 <= wave["first_divergent_frame"] < len(codes), wave["first_divergent_frame"]
    before = wave["frame_errors"][: wave["first_divergent_frame"]]
    assert max(before) <= wave["tol"] < wave["frame_errors"][wave["first_divergent_frame"]]
    assert wave["first_divergent_sample"] // 1920 == wave["first_divergent_frame"]
    assert f"from frame {wave['first_divergent_frame']}" in result["message"]
    spec = wave["spectrogram"]
    assert len(spec["diff_db"]) == spec["bins"] and len(spec["diff_db"][0]) == spec["frames"]


def test_a_differing_code_gets_its_frame_codebook_and_verdict(made, tmp_path):
    suite_dir, manifest = made
    case = cases_of(manifest)["say-greedy"]
    ref = reference(suite_dir, "say-greedy")
    codes = np.array(ref["refimpl.codes.0"])
    codes[5, 3] = (codes[5, 3] + 1) % 1024
    write_outputs(tmp_path, case, ref, codes=codes)
    result, _ = graded(suite_dir, tmp_path, "say-greedy")
    div = result["codes"]["first_divergence"]
    assert result["status"] == "fail" and (div["frame"], div["codebook"]) == (5, 3)
    assert div["verdict"] in ("numeric", "near_tie", "rule") and result["codes"]["frames_equal"] == 5


def test_audio_alone_says_where_the_codes_likely_part(made, tmp_path):
    """A port that gives only audio: one code changed at frame k is reported at frame k (its audio is our
    decoder on the changed codes); the reference's codes decoded give every frame; an error of the decoder
    alone (over the tolerance, under half a code change) leaves the codes equal."""
    suite_dir, manifest = made
    case = cases_of(manifest)["say-greedy"]
    codes = np.array(reference(suite_dir, "say-greedy")["refimpl.codes.0"])
    tok = SpeechTokenizer.from_pretrained(suite_dir / "checkpoints" / "customvoice", dtype=np.float32)

    def graded_audio(wav, name):
        folder = tmp_path / name / case["name"]
        folder.mkdir(parents=True)
        np.save(folder / "waveform.npy", wav)
        return graded(suite_dir, tmp_path / name, case["name"])

    for k, codebook in ((0, 0), (5, 3), (len(codes) - 1, 15)):
        changed = codes.copy()
        changed[k, codebook] = (changed[k, codebook] + 1) % tok.codebook_size
        result, report = graded_audio(tok.decode(changed), f"changed-{k}")
        audio = result["codes_from_audio"]
        assert result["status"] == "fail" and result["codes"] is None
        assert audio["frames_likely_equal"] == audio["first_frame_out_of_tolerance"] == k
        assert f"likely part at frame {k}" in result["message"]
        assert f"{k}/{len(codes)} likely equal (audio)" in grade.format_report(report)
    result, _ = graded_audio(tok.decode(codes), "same")
    assert result["status"] == "pass" and result["codes_from_audio"]["frames_likely_equal"] == len(codes)
    numerics = tok.decode(codes) + np.float32(1e-3) * np.sin(np.arange(len(codes) * 1920, dtype=np.float32))
    result, _ = graded_audio(numerics, "numerics")
    audio = result["codes_from_audio"]
    assert result["status"] == "fail" and audio["first_frame_out_of_tolerance"] == 0
    assert audio["frames_likely_equal"] == len(codes) and "codes likely equal in all" in result["message"]


def test_the_behaviours_a_port_chose(made, tmp_path):
    """One more frame (max_new_tokens frames) fails the official length, passes with length=natural; the
    exact one-pass decode of 330 frames fails the official 300/25 chunking, passes with decode=exact."""
    suite_dir, manifest = made
    cases = cases_of(manifest)
    ref = reference(suite_dir, "say-greedy")
    codes = np.concatenate([ref["refimpl.codes.0"], ref["refimpl.codes.0"][-1:]])
    wav = np.concatenate([np.squeeze(ref["refimpl.waveform.0"]), np.zeros(1920, np.float32)])
    write_outputs(tmp_path, cases["say-greedy"], ref, codes=codes, waveform=wav)
    chunked = reference(suite_dir, "codec-decode-chunked")
    write_outputs(tmp_path, cases["codec-decode-chunked"], chunked, waveform=chunked["refimpl.waveform_exact.0"])
    official = grade.grade_suite(suite_dir, tmp_path, "float32")
    status = {c["name"]: c["status"] for c in official["cases"]}
    assert status["say-greedy"] == "fail" and status["codec-decode-chunked"] == "fail"
    chunk_case = next(c for c in official["cases"] if c["name"] == "codec-decode-chunked")
    assert chunk_case["waveform"]["first_divergent_frame"] >= 275  # the first chunk's 300 frames are one pass
    chosen = grade.grade_suite(suite_dir, tmp_path, "float32", behaviours=["length=natural", "decode=exact"])
    status = {c["name"]: c["status"] for c in chosen["cases"]}
    assert status["say-greedy"] == "pass" and status["codec-decode-chunked"] == "pass"
    assert chosen["behaviours"] == {"length": "natural", "decode": "exact"}
    assert status["speaker"] == "not_run" and grade.exit_status(chosen) == 0


def test_unusable_results_and_suites(made, tmp_path):
    suite_dir, manifest = made
    results = tmp_path / "results"
    (results / "speaker").mkdir(parents=True)
    (results / "speaker" / "x_vector.npy").write_bytes(b"\x93NUMPY garbage")
    outside = tmp_path / "outside.npy"
    np.save(outside, np.zeros(3))
    (results / "say-greedy").mkdir()
    (results / "say-greedy" / "codes.npy").symlink_to(outside)
    (results / "codec-decode").mkdir()
    np.save(results / "codec-decode" / "something_else.npy", np.zeros(3))
    report = grade.grade_suite(suite_dir, results, "float32")
    status = {c["name"]: (c["status"], c["message"]) for c in report["cases"]}
    assert status["speaker"][0] == "unusable" and "x_vector.npy" in status["speaker"][1]
    assert status["say-greedy"][0] == "unusable" and "outside" in status["say-greedy"][1]
    assert status["codec-decode"][0] == "unusable" and "something_else" in status["codec-decode"][1]
    assert grade.exit_status(report) == 2
    with pytest.raises(suite.SuiteError, match="not a conformance suite"):
        grade.grade_suite(tmp_path, results)
    broken = tmp_path / "broken"
    shutil.copytree(suite_dir, broken, ignore=shutil.ignore_patterns("reference.*", "checkpoints"))
    manifest_path = broken / "manifest.json"
    data = json.loads(manifest_path.read_text())
    data["version"] = suite.SUITE_VERSION + 1
    manifest_path.write_text(json.dumps(data))
    with pytest.raises(suite.SuiteError, match="suite version"):
        grade.grade_suite(broken, results)
    data["version"] = suite.SUITE_VERSION
    for field, value, message in (
        ("agrees_with", ["qwen-tts"], "agrees_with must be a JSON object"),
        ("cases", [{"name": "x", "stage": 1}], "missing"),
        ("cases", [dict(data["cases"][0], title=["t"])], "title must be a string"),
        ("cases", [dict(data["cases"][0], sha256=["00"])], "sha256 must be a JSON object"),
        ("cases", [dict(data["cases"][0], frames=[True])], "frames must be a list"),
    ):
        manifest_path.write_text(json.dumps(dict(data, **{field: value})))
        with pytest.raises(suite.SuiteError, match=message):
            grade.grade_suite(broken, results)
    data["cases"][0]["references"]["float64"] = "../../manifest.json"
    manifest_path.write_text(json.dumps(data))
    with pytest.raises(suite.SuiteError, match="not a plain file name"):
        grade.grade_suite(broken, results)
    tampered = tmp_path / "tampered"
    shutil.copytree(suite_dir, tampered, ignore=shutil.ignore_patterns("checkpoints"))
    ref_file = tampered / "cases" / "codec-decode" / "reference.float64.safetensors"
    ref_file.write_bytes(ref_file.read_bytes()[:-8] + b"\0" * 8)
    one = tmp_path / "one"
    shutil.copytree(results / "codec-decode", one / "codec-decode")
    case, _ = graded(tampered, one, "codec-decode")
    assert case["status"] == "unusable" and "SHA-256" in case["message"]


def test_the_command_line(made, tmp_path, capsys):
    from refimpl.cli import main

    suite_dir, manifest = made
    results = tmp_path / "results"
    write_outputs(results, cases_of(manifest)["speaker"], reference(suite_dir, "speaker"))
    html = tmp_path / "report.html"
    assert main(["conformance", "grade", str(suite_dir), str(results), "--json", "--html", str(html)]) == 0
    report = json.loads(capsys.readouterr().out)
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "speaker" in page and "http://" not in page
    assert report["counts"]["passed"] == 1 and report["counts"]["not_run"] == len(manifest["cases"]) - 1
    assert main(["conformance", "grade", str(suite_dir), str(tmp_path / "absent")]) == 2
    assert "unusable input" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["conformance", "grade", str(suite_dir), str(results), "--behaviour", "decode=fast"])
    assert e.value.code == 2 and "not a known behaviour" in capsys.readouterr().err
    assert main(["conformance", "make", "-o", str(suite_dir)]) == 1  # not empty: refused, nothing touched
    assert "not an empty directory" in capsys.readouterr().err


def test_the_docs_tolerance_table_is_the_rule():
    """docs/conformance.md's table says what suite.tolerance_table() computes (two significant digits)."""
    doc = (Path(__file__).parents[2] / "docs" / "conformance.md").read_text()
    table = suite.tolerance_table()
    columns = ("decoder", "encoder", "speaker_encoder", "talker")
    for precision in ("float32", "bfloat16", "float16"):
        row = next(line for line in doc.splitlines() if line.startswith(f"| {precision} |"))
        cells = [float(c) for c in row.strip("|").split("|")[1:]]
        for net, cell in zip(columns, cells, strict=True):
            assert cell == pytest.approx(table[precision][net], rel=0.05), (precision, net)


def test_a_waveform_of_another_length_is_still_judged_by_its_values(made, tmp_path):
    """Half the amplitude and one frame too many: wrong from frame 0, not only where the lengths part."""
    suite_dir, manifest = made
    ref = reference(suite_dir, "codec-decode-stream")
    wav = np.squeeze(ref["refimpl.waveform.0"])
    write_outputs(tmp_path, cases_of(manifest)["codec-decode-stream"], ref, waveform=np.r_[wav / 2, np.zeros(1920)])
    result, _ = graded(suite_dir, tmp_path, "codec-decode-stream")
    assert result["status"] == "fail" and result["waveform"]["first_divergent_frame"] == 0
    assert result["waveform"]["tol"] > 0 and "(7680,)" not in result["message"]
    assert "the port's shape (78720,), the reference's (76800,)" in result["message"], result["message"]


def test_a_suite_of_given_checkpoints_allows_the_released_noise(tmp_path):
    """Checkpoints given with --model (the released ones, in use) are graded with the noise measured at the
    released size: the manifest says so, its table and the grader's tolerance follow it."""
    given = [suite.EMBEDDED / "default-customvoice"]
    manifest = suite.make_suite(tmp_path / "suite", given)
    assert manifest["noise"] == "released" and {c["stage"] for c in manifest["cases"]} == {
        "codec-decode",
        "codec-encode",
        "say",
    }
    tiny = suite.tolerance_table("tiny")["float32"]
    assert manifest["tolerances"]["float32"]["decoder"] > 4 * tiny["decoder"]
    ref = reference(tmp_path / "suite", "codec-decode-stream")
    wav = np.squeeze(ref["refimpl.waveform.0"]).astype(np.float64)
    scale = max(1.0, float(np.abs(wav).max()))
    off = wav + 2 * tiny["decoder"] * scale  # twice the tiny tolerance, within the released one
    write_outputs(tmp_path / "results", cases_of(manifest)["codec-decode-stream"], ref, waveform=off)
    released, report = graded(tmp_path / "suite", tmp_path / "results", "codec-decode-stream")
    assert released["status"] == "pass" and report["noise"] == "released"
    data = json.loads((tmp_path / "suite" / "manifest.json").read_text())
    (tmp_path / "suite" / "manifest.json").write_text(json.dumps(dict(data, noise="tiny")))
    assert graded(tmp_path / "suite", tmp_path / "results", "codec-decode-stream")[0]["status"] == "fail"
    assert "measured on released checkpoints" in (tmp_path / "suite" / "README.md").read_text()


def test_a_waveform_given_as_wav(made, tmp_path):
    """waveform.wav (float samples, 24 kHz) is read like waveform.npy; another rate is unusable, said so."""
    from refimpl.io.audio import write_wav

    suite_dir, _ = made
    ref = reference(suite_dir, "codec-decode-stream")
    wav = np.squeeze(ref["refimpl.waveform.0"])
    (tmp_path / "good" / "codec-decode-stream").mkdir(parents=True)
    write_wav(tmp_path / "good" / "codec-decode-stream" / "waveform.wav", wav, 24000, sample_format="float")
    assert graded(suite_dir, tmp_path / "good", "codec-decode-stream")[0]["status"] == "pass"
    (tmp_path / "bad" / "codec-decode-stream").mkdir(parents=True)
    write_wav(tmp_path / "bad" / "codec-decode-stream" / "waveform.wav", wav, 16000, sample_format="float")
    case, _ = graded(suite_dir, tmp_path / "bad", "codec-decode-stream")
    assert case["status"] == "unusable" and "24000 Hz" in case["message"]
