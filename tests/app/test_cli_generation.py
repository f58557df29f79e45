"""``fxlrp explain --model hf:DIR --text ... --generate N``: a tiny GPT-2 with a byte-level tokenizer
built here (no downloads), saved with save_pretrained. The continuation is the one ``generate``
gives from Python (greedy, or sampled with the seed), the written matrix is
``fxlrp.explain_generation``'s for it, and each printed row lists the context tokens of largest
relevance in that matrix."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

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
