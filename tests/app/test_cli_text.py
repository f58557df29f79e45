"""``fxlrp explain --model hf:DIR --text ...``: a tiny BERT classifier and a tiny GPT-2 language
model with tokenizers built here (no downloads), saved with save_pretrained. The printed tokens
are the text's tokens, and the relevance the HTML carries is ``fxlrp.attribute``'s."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import pytest
import torch

import fxlrp
from fxlrp.app import cli

transformers = pytest.importorskip("transformers")
from support import tokenizers  # noqa: E402

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie", "was", "good", "bad", "un", "##believ",
         "##able", "plot", "!", "<", ">", "script"]
TEXT = "The movie was unbelievable good!"
TOKENS = ["[CLS]", "the", "movie", "was", "un", "##believ", "##able", "good", "!", "[SEP]"]


def wordpiece_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """BERT's tokenization over WORDS."""
    return tokenizers.wordpiece_tokenizer(WORDS)


def bytelevel_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """GPT-2's byte-level BPE, trained here on a few sentences."""
    return tokenizers.bytelevel_tokenizer(["the movie was good", "the plot was bad", "a good movie\nthe end"])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=24, num_labels=2,
                                     initializer_range=0.4,  # BERT's 0.02 leaves all relevance on [CLS]
                                     id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    bert = transformers.BertForSequenceClassification(config).eval()
    bert.save_pretrained(folder / "bert")
    wordpiece_tokenizer().save_pretrained(folder / "bert")
    bytelevel = bytelevel_tokenizer()
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(bytelevel), n_positions=32, n_embd=16, n_layer=2, n_head=2)).eval()
    gpt2.save_pretrained(folder / "gpt2")
    bytelevel.save_pretrained(folder / "gpt2")
    bert.save_pretrained(folder / "no_tokenizer")
    (folder / "empty").mkdir()
    return {name: folder / name for name in ("bert", "gpt2", "no_tokenizer", "empty")}


def run(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(arguments)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def html_relevance(path: Path) -> list[tuple[str, float]]:
    page = path.read_text(encoding="utf-8")
    return [(html.unescape(shown), float(value)) for value, shown in
            re.findall(r'data-relevance="([^"]+)"[^>]*>(.*?)</span>', page, re.S)]


def printed_tokens(line: str) -> list[tuple[str, float]]:
    """(shown text, normalised relevance) of each token of a plain (uncoloured) token line."""
    return [(shown, float(value)) for shown, value in re.findall(r"(\S+?)\(([+-][0-9.]+)\)", line)]


def reference(directory: Path, loader: str, text: str, composite: object, target: object) -> tuple[list[str],
                                                                                                    torch.Tensor]:
    """The tokens and fxlrp.attribute's relevance for the same model, ids and target, from Python."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = getattr(transformers, loader).from_pretrained(directory).eval()
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    relevance = fxlrp.attribute(fxlrp.convert(model, composite), ids, target=target)[0]
    return tokenizer.convert_ids_to_tokens(ids[0]), relevance


def relative_error(found: list[float], expected: torch.Tensor) -> float:
    expected = expected.double()
    return float((torch.tensor(found, dtype=torch.float64) - expected).abs().max() / expected.abs().max())


@pytest.mark.parametrize(("composite", "expected"), [(None, fxlrp.composites.AttnLRP()),
                                                     ("cplrp", fxlrp.composites.CPLRP())])
def test_classifier_text_tokens_and_relevance(saved: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path, composite: str | None, expected: object) -> None:
    options = [] if composite is None else ["--composite", composite]
    code, stdout, stderr = run(["explain", "--model", f"hf:{saved['bert']}", "--text", TEXT, "--target", "positive",
                                *options, "--out", str(tmp_path)], capsys)
    assert code == 0, stderr
    heading, tokens_line, written = stdout.strip().splitlines()
    assert heading.startswith("class 1 'positive' (logit ")
    assert heading.endswith(composite or "attnlrp")
    assert written == f"-> {tmp_path / 'explanation.html'}"
    tokens, relevance = reference(saved["bert"], "AutoModelForSequenceClassification", TEXT, expected, 1)
    assert tokens == TOKENS
    printed = printed_tokens(tokens_line)
    assert [shown for shown, _ in printed] == [token.removeprefix("##") for token in TOKENS]
    assert "un(" in tokens_line and ")believ(" in tokens_line  # subwords printed attached to their word
    normalised = (relevance / relevance.abs().max()).tolist()
    assert max(abs(value - want) for (_, value), want in zip(printed, normalised, strict=True)) <= 0.005 + 1e-9
    in_html = html_relevance(tmp_path / "explanation.html")
    assert [shown for shown, _ in in_html] == [shown for shown, _ in printed]
    assert relative_error([value for _, value in in_html], relevance) < 1e-6
    assert sum(abs(value) >= 0.01 for _, value in printed) >= 5  # relevance spread over tokens, not one [CLS]


def test_merged_words_and_several_texts(saved: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    code, stdout, stderr = run(["explain", "--model", f"hf:{saved['bert']}", "--text", TEXT, "--text", "bad plot",
                                "--merge-subwords", "--target", "0", "--out", str(tmp_path)], capsys)
    assert code == 0, stderr
    lines = stdout.strip().splitlines()
    assert len(lines) == 5 and lines[0].startswith("class 0 'negative'") and lines[2].startswith("class 0 ")
    _, relevance = reference(saved["bert"], "AutoModelForSequenceClassification", TEXT,
                             fxlrp.composites.AttnLRP(), 0)
    words = [shown for shown, _ in printed_tokens(lines[1])]
    assert words == ["[CLS]", "the", "movie", "was", "unbelievable", "good", "!", "[SEP]"]
    in_html = html_relevance(tmp_path / "explanation.html")
    assert [shown for shown, _ in in_html][:8] == words and [shown for shown, _ in in_html][8:] == [
        "[CLS]", "bad", "plot", "[SEP]"]
    merged = torch.cat([relevance[:4], relevance[4:7].sum(0, keepdim=True), relevance[7:]])
    assert relative_error([value for _, value in in_html[:8]], merged) < 1e-6


def test_language_model_explains_the_next_token(saved: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    prompt = "the movie was\ngood"
    code, stdout, stderr = run(["explain", "--model", f"hf:{saved['gpt2']}", "--text", prompt, "--target", " movie",
                                "--out", str(tmp_path)], capsys)
    assert code == 0, stderr
    heading, *token_lines, _ = stdout.strip().splitlines()
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved["gpt2"])
    [movie] = tokenizer(" movie", add_special_tokens=False)["input_ids"]
    assert heading.startswith(f"next token ' movie' (id {movie}, logit ")  # (decoded, not the BPE piece 'Ġmovie')
    title = re.search(r'class="fxlrp-title"[^>]*>(.*?)</div>', (tmp_path / "explanation.html").read_text("utf-8"))
    assert html.unescape(title.group(1)) == heading  # (the page's title the same)
    tokens, relevance = reference(saved["gpt2"], "AutoModelForCausalLM", prompt, fxlrp.composites.AttnLRP(), movie)
    assert "Ċ" in tokens  # the newline is a token ...
    printed = printed_tokens("\n".join(token_lines))
    assert "".join(shown for shown, _ in printed).replace("↵", "\n") == prompt.replace(" ", "")  # ... printed as ↵
    assert len(token_lines) == 2  # and the line break is kept
    in_html = html_relevance(tmp_path / "explanation.html")
    assert len(in_html) == len(tokens)
    assert relative_error([value for _, value in in_html], relevance) < 1e-6
    # no --target: the predicted next token
    code, stdout, _ = run(["explain", "--model", f"hf:{saved['gpt2']}", "--text", prompt], capsys)
    model = transformers.AutoModelForCausalLM.from_pretrained(saved["gpt2"]).eval()
    predicted = int(model(tokenizer(prompt, return_tensors="pt")["input_ids"]).logits[0, -1].argmax())
    assert code == 0
    assert stdout.startswith(f"next token {tokenizer.decode([predicted])!r} (id {predicted},")


def test_a_next_token_that_is_a_byte_of_a_character_says_so(saved: dict[str, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A byte-level piece that decodes to no character alone (U+FFFD) is shown as the vocabulary
    writes it, said to be a part of a character (not as a replacement character)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(saved["gpt2"])
    piece = next(token_id for token_id in range(len(tokenizer)) if tokenizer.decode([token_id]) == "\ufffd")
    code, stdout, stderr = run(["explain", "--model", f"hf:{saved['gpt2']}", "--text", "the movie", "--target",
                                str(piece)], capsys)
    assert code == 0, stderr
    raw = tokenizer.convert_ids_to_tokens(piece)
    assert stdout.startswith(f"next token {raw!r} (a part of a multi-byte character) (id {piece}, logit ")


def bad_text_inputs(saved: dict[str, Path], tmp_path: Path) -> list[tuple[list[str], str]]:
    bert = ["explain", "--model", f"hf:{saved['bert']}"]
    missing = tmp_path / "missing"
    return [
        (["explain", "--model", f"hf:{missing}", "--text", "good"], f"model directory '{missing}' does not exist"),
        (["explain", "--model", f"hf:{saved['empty']}", "--text", "good"], "has no config.json; save the model"),
        (["explain", "--model", f"hf:{saved['no_tokenizer']}", "--text", "good"],
         f"no tokenizer in '{saved['no_tokenizer']}'"),
        (["explain", "--model", "hf:", "--text", "good"], "hf: needs a directory"),
        (["explain", "--model", "torchvision:resnet18", "--text", "good"], "--text needs a Hugging Face model"),
        ([*bert, "--out", str(tmp_path)], "hf: models explain text: pass --text"),
        ([*bert, "--text", "  "], "--text is empty"),
        ([*bert, "--text", "good", "picture.png"], "give --text or image files, not both"),
        ([*bert, "--text", "good", "--target", "neutral"], "--target 'neutral' is neither a class index (0..1) nor a "
                                                           "label of the model (negative, positive)"),
        ([*bert, "--text", "good", "--target", "2"], "--target 2 is out of range: the model has 2 classes"),
        ([*bert, "--text", "good", "--composite", "magic"], "unknown composite 'magic'"),
        ([*bert, "--text", "good", "--composite", "epsilon_gamma_box"], "epsilon_gamma_box needs the value range"),
        ([*bert, "--text", "good " * 30], "tokens; the model takes at most 24"),
        (["explain", "--model", f"hf:{saved['gpt2']}", "--text", "good", "--target", "the movie"],
         "--target 'the movie' is 2 tokens (the Ġmovie); give one token or a token id"),
    ]


def test_each_bad_text_input_gives_one_line_and_exit_code_2(saved: dict[str, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    for arguments, message in bad_text_inputs(saved, tmp_path):
        code, stdout, stderr = run(arguments, capsys)
        assert code == 2, (arguments, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fxlrp: error: "), (arguments, stderr)
        assert message in lines[0], (message, lines[0])
        assert stdout == ""
    assert not (tmp_path / "explanation.html").exists()


def test_without_transformers_one_line(saved: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    code, stdout, stderr = run(["explain", "--model", f"hf:{saved['bert']}", "--text", "good"], capsys)
    assert code == 2 and stdout == ""
    assert stderr.strip() == "fxlrp: error: hf: models need the transformers package: pip install 'fxlrp[text]'"
