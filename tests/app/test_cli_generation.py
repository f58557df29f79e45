"""``fxlrp explain --model hf:DIR --text ... --generate N``: a tiny GPT-2 with a byte-level tokenizer
built here (no downloads), saved with save_pretrained. The continuation is the one ``generate``
gives from Python (greedy, or sampled with the seed), the written matrix is
``fxlrp.explain_generation``'s for it, and each printed row lists the context tokens of largest
relevance in that matrix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.command_line import ENVIRONMENT, ROOT, snapshot

import fxlrp
from app.test_cli_text import bytelevel_tokenizer, run

transformers = pytest.importorskip("transformers")

PROMPT = "the movie was"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    tokenizer = bytelevel_tokenizer()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=32, n_embd=16, n_layer=2, n_head=2)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _reference(directory: Path, new: int, seed: int | None = None) -> tuple[torch.Tensor, fxlrp.GenerationExplanation]:
    """What the command does, from Python: generate, then explain_generation with AttnLRP."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        sequences = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                   do_sample=seed is not None, pad_token_id=tokenizer.eos_token_id)
    explain = fxlrp.convert(model, fxlrp.composites.AttnLRP())
    return sequences, fxlrp.explain_generation(explain, sequences, ids.shape[1])


def _strongest_positions(stdout: str) -> list[int]:
    """The position of the first (strongest) context token listed on each row's line."""
    return [int(found) for found in re.findall(r"^step \d+.*?: '.*?'@(\d+) ", stdout, re.M)]


def test_generate_prints_each_token_with_its_strongest_context_and_writes_the_matrix(
        saved: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, stdout, stderr = run(["explain", "--model", f"hf:{saved}", "--text", PROMPT, "--generate", "4",
                                "--out", str(tmp_path)], capsys)
    assert code == 0, stderr
    sequences, expected = _reference(saved, 4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved)
    continuation = tokenizer.decode(sequences[0, -4:])
    assert stdout.startswith(f"{PROMPT!r} + 4 tokens (greedy): {continuation!r}, attnlrp\n")
    matrix = np.load(tmp_path / "generation-0.npy")
    assert matrix.shape == (4, sequences.shape[1])
    reference = expected.relevance[0].numpy()
    assert np.abs(matrix - reference).max() <= 1e-6 * np.abs(reference).max()
    assert _strongest_positions(stdout) == np.abs(reference).argmax(axis=1).tolist()
    assert (tmp_path / "generation-0.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert (tmp_path / "generation-0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert stdout.rstrip().endswith(f"-> {tmp_path / 'generation-0.npy'}, {tmp_path / 'generation-0.html'}, "
                                    f"{tmp_path / 'generation-0.png'}")


def test_sampling_with_a_seed_repeats(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--sample --seed S``: the continuation ``generate`` samples after ``torch.manual_seed(S)``,
    the same on every run; another seed gives another continuation here."""
    arguments = ["explain", "--model", f"hf:{saved}", "--text", PROMPT, "--generate", "6", "--sample"]
    outputs = [run([*arguments, "--seed", seed], capsys) for seed in ("3", "3", "4")]
    assert [code for code, _, _ in outputs] == [0, 0, 0]
    assert outputs[0][1] == outputs[1][1] and outputs[0][1] != outputs[2][1]
    sequences, _ = _reference(saved, 6, seed=3)
    continuation = transformers.AutoTokenizer.from_pretrained(saved).decode(sequences[0, -6:])
    assert outputs[0][1].startswith(f"{PROMPT!r} + 6 tokens (sampled): {continuation!r}, ")


def test_bad_generation_options_give_one_line_and_exit_code_2(saved: Path, capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    gpt2 = ["explain", "--model", f"hf:{saved}", "--text", PROMPT]
    cases = [
        ([*gpt2, "--generate", "0"], "--generate takes the number of tokens to generate, at least 1; got 0"),
        ([*gpt2, "--sample"], "--sample chooses how --generate N generates; give --generate N too"),
        ([*gpt2, "--generate", "2", "--seed", "1"], "--seed seeds --sample"),
        ([*gpt2, "--generate", "2", "--target", "the"], "with --generate each generated token is explained"),
        ([*gpt2, "--generate", "40"], "tokens and 40 generated ones; the model takes at most 32"),
    ]
    for arguments, message in cases:
        code, stdout, stderr = run([*arguments, "--out", str(tmp_path)], capsys)
        assert code == 2, (arguments, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fxlrp: error: ") and message in lines[0], (message, stderr)
        assert stdout == ""
    assert not list(tmp_path.iterdir())


def _reference_of(directory: Path, prompt: str, new: int) -> fxlrp.GenerationExplanation:
    """explain_generation in float64 of the greedy continuation of ``prompt``, from Python."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).double().eval()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        sequences = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                   do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return fxlrp.explain_generation(fxlrp.convert(model, fxlrp.composites.AttnLRP()), sequences, ids.shape[1])


def test_a_file_of_prompts_is_explained_into_resumable_shards(saved: Path, capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    """``--data prompts.txt --generate N``: each prompt's stored matrix (and token ids) is
    explain_generation's for its greedy continuation (float64, within 1e-10); a run killed after
    its first shard and started again writes the same files as the uninterrupted run."""
    prompts = ["the movie was", "a plot", "it is not bad at all"]
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    command = ["explain", "--model", f"hf:{saved}", "--data", str(data), "--generate", "3", "--out", str(out),
               "--shard-size", "2", "--dtype", "float64"]
    code, stdout, stderr = run(command, capsys)
    assert code == 0, stderr
    found = fxlrp.read_explanations(out)
    assert found.names == prompts and found.relevance.dtype == np.float64
    tokens = np.concatenate([np.load(out / "shards" / f"tokens-{shard:06d}.npy") for shard in (0, 1)])
    for index, prompt in enumerate(prompts):
        expected = _reference_of(saved, prompt, 3)
        length = expected.sequences.shape[1]
        reference = expected.relevance[0].numpy()
        assert np.abs(found.relevance[index, :, :length] - reference).max() <= 1e-10 * np.abs(reference).max()
        assert not found.relevance[index, :, length:].any()
        assert tokens[index, :length].tolist() == expected.sequences[0].tolist()
        assert (tokens[index, length:] == -1).all()
    written = {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    for path in (out / "index.json", out / "shards" / "relevance-000001.json", out / "shards" / "relevance-000001.npy",
                 out / "shards" / "tokens-000001.npy"):
        path.unlink()  # (a run killed while its second shard was computed)
    code, stdout, stderr = run(command, capsys)
    assert code == 0, stderr
    assert "1 of 2 shards were already complete" in stdout
    assert {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()} == written


def test_a_bad_file_of_prompts_gives_one_line(saved: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = tmp_path / "prompts.txt"
    data.write_text("the movie was\n\nbad\n", encoding="utf-8")
    cases = [(["--data", str(data), "--generate", "2"], f"line 2 of {str(data)!r} is blank"),
             (["--data", str(data)], "give --generate N too"),
             (["--data", str(tmp_path / "none.txt"), "--generate", "2"], "is not a file"),
             (["--data", str(data), "--generate", "2", "--png"], "--png is not taken with a file of prompts")]
    for arguments, message in cases:
        code, stdout, stderr = run(["explain", "--model", f"hf:{saved}", *arguments, "--out", str(tmp_path / "o")],
                                   capsys)
        lines = stderr.strip().splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0], (message, stderr)
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def saved_t5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "t5"
    tokenizer = bytelevel_tokenizer()
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=len(tokenizer), d_model=16, d_ff=32, d_kv=8, num_layers=1, num_decoder_layers=1, num_heads=2,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _seq2seq_references(directory: Path, prompts: list[str], new: int) -> list[fxlrp.GenerationExplanation]:
    """explain_generation with ``source=`` in float64 of the greedy continuation of each prompt by
    an encoder-decoder model, from Python."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.T5ForConditionalGeneration.from_pretrained(directory).double().eval()
    explain = fxlrp.convert(model, fxlrp.composites.AttnLRP())
    found = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            sequences = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                       min_new_tokens=new, do_sample=False)
        found.append(fxlrp.explain_generation(explain, sequences, 1, source=ids, source_mask=torch.ones_like(ids)))
    return found


def test_an_encoder_decoder_model_explains_each_decoder_step_over_its_input(
        saved_t5: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A tiny T5 (``--generate`` on an encoder-decoder model): the matrices over the decoder's
    tokens and over the encoder's input (``.source.npy``) are explain_generation's with
    ``source=`` for the continuation generate gives (float64, within 1e-10)."""
    code, stdout, stderr = run(["explain", "--model", f"hf:{saved_t5}", "--text", PROMPT, "--generate", "3",
                                "--dtype", "float64", "--out", str(tmp_path / "out")], capsys)
    assert code == 0, stderr
    [expected] = _seq2seq_references(saved_t5, [PROMPT], 3)
    sequences = expected.sequences
    continuation = transformers.AutoTokenizer.from_pretrained(saved_t5).decode(sequences[0, 1:],
                                                                               skip_special_tokens=True)
    assert stdout.startswith(f"{PROMPT!r} + 3 tokens (greedy): {continuation!r}, attnlrp\n")
    for name, reference in (("generation-0.npy", expected.relevance[0]),
                            ("generation-0.source.npy", expected.source_relevance[0])):
        matrix = np.load(tmp_path / "out" / name)
        assert matrix.shape == tuple(reference.shape) and matrix.dtype == np.float64
        assert np.abs(matrix - reference.numpy()).max() <= 1e-10 * reference.abs().max().item()


def test_a_file_of_prompts_for_an_encoder_decoder_model_stores_the_matrix_over_each_prompt(
        saved_t5: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--data prompts.txt --generate N`` on a T5: per prompt, the matrix over the decoder's tokens
    (and their ids) and the one over the prompt, the encoder's input (``source-relevance-K.npy``,
    its ids in ``source-tokens-K.npy``), are explain_generation's with ``source=`` (float64, within
    1e-10); 0 and -1 after each prompt's tokens."""
    prompts = ["the movie was", "a plot"]
    data = tmp_path / "prompts.txt"
    data.write_text("\n".join(prompts) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code, stdout, stderr = run(["explain", "--model", f"hf:{saved_t5}", "--data", str(data), "--generate", "3",
                                "--out", str(out), "--shard-size", "1", "--dtype", "float64"], capsys)
    assert code == 0, stderr
    found = fxlrp.read_explanations(out)
    assert found.names == prompts

    def stored(kind: str) -> np.ndarray:
        return np.concatenate([np.load(out / "shards" / f"{kind}-{shard:06d}.npy") for shard in (0, 1)])

    tokens, source, source_tokens = stored("tokens"), stored("source-relevance"), stored("source-tokens")
    assert source.dtype == np.float64 and source.shape[:2] == (2, 3)
    for index, expected in enumerate(_seq2seq_references(saved_t5, prompts, 3)):
        for matrix, ids, reference, reference_ids in (
                (found.relevance[index], tokens[index], expected.relevance[0], expected.sequences[0]),
                (source[index], source_tokens[index], expected.source_relevance[0], expected.source_ids[0])):
            length = reference.shape[1]
            assert np.abs(matrix[:, :length] - reference.numpy()).max() <= 1e-10 * reference.abs().max().item()
            assert not matrix[:, length:].any()
            assert ids[:length].tolist() == reference_ids.tolist() and (ids[length:] == -1).all()
    assert f"over each prompt's tokens [2, 3, {source.shape[2]}]" in stdout


@pytest.mark.slow  # (three interpreters importing transformers: about 30 s)
def test_two_processes_with_torchrun_write_the_files_of_one_for_a_file_of_prompts(saved: Path,
                                                                                   tmp_path: Path) -> None:
    """torchrun --nproc-per-node 2 (gloo, CPU) with ``--data prompts.txt --generate N``: 5 prompts in
    3 shards, shards 0 and 2 (3 prompts) for the first process and shard 1 (2) for the second; the
    directory is byte for byte that of one process."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.is_file():
        pytest.skip("torchrun is not installed beside this Python")
    data = tmp_path / "prompts.txt"
    data.write_text("the movie was\na plot\nit is not bad at all\nwell\nso it goes\n", encoding="utf-8")

    def command(out: Path) -> list[str]:
        return ["-m", "fxlrp", "explain", "--model", f"hf:{saved}", "--data", str(data), "--generate", "2", "--out",
                str(out), "--shard-size", "2", "--dtype", "float64"]

    two = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", *command(tmp_path / "two")],
                         env=ENVIRONMENT, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr
    assert "process 0 of 2: 2 shard(s), 3 prompts" in two.stderr, two.stderr
    assert "process 1 of 2: 1 shard(s), 2 prompts" in two.stderr, two.stderr
    one = subprocess.run([sys.executable, *command(tmp_path / "one")], env=ENVIRONMENT, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr
    assert "process" not in one.stderr
    files = snapshot(tmp_path / "two")
    assert files == snapshot(tmp_path / "one")
    assert sorted(name for name in files if name.startswith("shards/tokens-")) == [
        f"shards/tokens-{shard:06d}.npy" for shard in range(3)]
    assert fxlrp.read_explanations(tmp_path / "two").names == data.read_text(encoding="utf-8").splitlines()
