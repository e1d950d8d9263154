"""Tokenizer: fixed special ids, training (unigram/BPE, English/Chinese), clear load errors."""

import pathlib
import unicodedata

import pytest

from bertjax.commands import tokenizer as tokenizer_cmd
from bertjax.data import tokenizer as tok_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
BUNDLED = REPO / "data" / "tokenizer.model"
CHINESE = REPO / "tests" / "fixtures" / "data" / "chinese.txt"


def test_bundled_tokenizer_has_fixed_special_ids():
  tok = tok_lib.SentencePieceTokenizer(BUNDLED)
  pieces = [tok.id_to_piece(i) for i in range(5)]
  assert pieces == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert (tok_lib.PAD_ID, tok_lib.UNK_ID, tok_lib.CLS_ID, tok_lib.SEP_ID, tok_lib.MASK_ID) == (
      0,
      1,
      2,
      3,
      4,
  )
  assert 7000 <= tok.vocab_size <= 8000
  assert len(tok.sha256) == 64
  # The attributes WordPieceTokenizer also has, so callers need not know which it is.
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)


def test_encode_decode_roundtrip_and_word_starts():
  tok = tok_lib.SentencePieceTokenizer(BUNDLED)
  text = "It is a truth universally acknowledged, that a single man in 1811."
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok_lib.UNK_ID not in ids
  assert tok.is_word_start(ids[0]) and tok.id_to_piece(ids[0]).startswith("\u2581")
  comma = tok.piece_to_id(",")
  assert not tok.is_word_start(comma)
  assert not any(tok.is_word_start(i) for i in range(5))


def test_special_token_text_is_not_a_special_token():
  tok = tok_lib.SentencePieceTokenizer(BUNDLED)
  ids = tok.encode("[MASK] [CLS] [SEP] [PAD]")
  assert not set(ids) & {0, 2, 3, 4}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_train_english(tmp_path, model_type):
  sample = tmp_path / "sample.txt"
  lines = (REPO / "data" / "austen.txt").read_text().splitlines()[:3000]
  sample.write_text("\n".join(lines))
  tok = tok_lib.train_tokenizer(
      [str(sample)],
      str(tmp_path / "en"),
      tok_lib.TrainOptions(vocab_size=600, model_type=model_type, num_threads=1),
  )
  assert (tmp_path / "en.model").is_file() and (tmp_path / "en.vocab").is_file()
  assert [tok.id_to_piece(i) for i in range(5)] == list(tok_lib.SPECIAL_PIECES)
  ids = tok.encode("Elinor and Marianne walked to Barton.")
  assert tok.decode(ids) == "Elinor and Marianne walked to Barton."


def test_train_chinese_characters_do_not_become_unk(tmp_path, capsys):
  rc = tokenizer_cmd.main(
      ["train", "--input", str(CHINESE), "--vocab-size", "700", "--output", str(tmp_path / "zh")]
  )
  assert rc == 0, capsys.readouterr().err
  tok = tok_lib.SentencePieceTokenizer(tmp_path / "zh.model")
  for line in CHINESE.read_text(encoding="utf-8").splitlines():
    if line:
      ids = tok.encode(line)
      assert tok_lib.UNK_ID not in ids, line
      # SentencePiece applies NFKC: full-width punctuation becomes ASCII.
      assert tok.decode(ids) == unicodedata.normalize("NFKC", line)
  # A character never seen in training falls back to bytes, not [UNK].
  ids = tok.encode("龘")
  assert tok_lib.UNK_ID not in ids and tok.decode(ids) == "龘"


def test_too_small_vocab_is_a_one_line_error(tmp_path, capsys):
  rc = tokenizer_cmd.main(
      ["train", "--input", str(CHINESE), "--vocab-size", "300", "--output", str(tmp_path / "zh")]
  )
  err = capsys.readouterr().err
  assert rc == 1 and "vocab" in err.lower() and len(err.strip().splitlines()) == 1


def test_glob_input_and_missing_input(tmp_path, capsys):
  rc = tokenizer_cmd.main(
      [
          "train",
          "--input",
          str(tmp_path / "nothing*.txt"),
          "--vocab-size",
          "400",
          "--output",
          str(tmp_path / "x"),
      ]
  )
  err = capsys.readouterr().err
  assert rc == 1 and "nothing*.txt: no such file" in err and len(err.strip().splitlines()) == 1


def _one_line_error(path) -> str:
  with pytest.raises(tok_lib.TokenizerError) as e:
    tok_lib.SentencePieceTokenizer(path)
  message = str(e.value)
  assert str(path) in message and "\n" not in message
  return message


def test_missing_truncated_and_foreign_files(tmp_path):
  assert "not found" in _one_line_error(tmp_path / "missing.model")
  truncated = tmp_path / "truncated.model"
  truncated.write_bytes(BUNDLED.read_bytes()[:1000])
  assert "truncated" in _one_line_error(truncated)
  text_file = tmp_path / "notes.model"
  text_file.write_text("this is not a model\n")
  assert "not a SentencePiece model" in _one_line_error(text_file)


def test_model_without_bert_special_tokens_is_rejected(tmp_path):
  import sentencepiece as spm

  sample = tmp_path / "sample.txt"
  sample.write_text("\n".join((REPO / "data" / "austen.txt").read_text().splitlines()[:500]))
  with tok_lib._stderr_to(tmp_path / "log"):
    spm.SentencePieceTrainer.train(
        input=str(sample), model_prefix=str(tmp_path / "plain"), vocab_size=300
    )
  assert "expected" in _one_line_error(tmp_path / "plain.model")


def test_cli_info_and_encode(capsys):
  assert tokenizer_cmd.main(["info", "--model", str(BUNDLED)]) == 0
  assert '"[MASK]": 4' in capsys.readouterr().out
  assert tokenizer_cmd.main(["encode", "--model", str(BUNDLED), "Pride", "and"]) == 0
  pieces, ids = capsys.readouterr().out.strip().splitlines()
  tok = tok_lib.SentencePieceTokenizer(BUNDLED)
  assert [int(i) for i in ids.split()] == tok.encode("Pride and")
  assert "".join(pieces.split()).replace("\u2581", " ").strip() == "Pride and"


TANG = REPO / "tests" / "fixtures" / "data" / "tang300.txt"  # 313 Tang poems, 2,552 characters


def test_chinese_vocab_smaller_than_its_characters_picks_the_coverage(tmp_path, capsys):
  # With coverage 1.0 SentencePiece refuses this ("Vocabulary size is smaller than
  # required_chars. 2700 vs 2814"); the coverage is chosen, printed, and rare characters
  # become byte pieces.
  rc = tokenizer_cmd.main(
      ["train", "--input", str(TANG), "--vocab-size", "2700", "--output", str(tmp_path / "zh")]
  )
  err = capsys.readouterr().err
  assert rc == 0, err
  assert "character coverage 0.98" in err
  tok = tok_lib.SentencePieceTokenizer(tmp_path / "zh.model")
  assert tok.vocab_size == 2700
  text = "床前明月光，疑是地上霜。"
  ids = tok.encode(text)
  assert tok_lib.UNK_ID not in ids and tok.decode(ids) == unicodedata.normalize("NFKC", text)
  rare = next(
      ch
      for ch, n in tok_lib.count_characters([str(TANG)]).items()
      if n == 1 and tok.piece_to_id(ch) == tok_lib.UNK_ID
  )
  assert tok.decode(tok.encode(rare)) == rare  # an uncovered character: byte pieces


@pytest.mark.slow
def test_automatic_coverage_keeps_every_character_when_they_fit(tmp_path, capsys):
  counts = tok_lib.count_characters([str(TANG)])
  assert len(counts) == 2552  # after NFKC, without spaces
  assert tok_lib.choose_character_coverage(counts, 4000) == (1.0, 2552)
  coverage, kept = tok_lib.choose_character_coverage(counts, 3000)
  assert coverage == tok_lib.MIN_COVERAGE and kept >= int(0.7 * (3000 - 261))
  tok_lib.train_tokenizer(
      [str(BUNDLED.parent / "austen.txt")],
      str(tmp_path / "en"),
      tok_lib.TrainOptions(vocab_size=2000),
  )
  assert "coverage" not in capsys.readouterr().err  # English: every character fits


def test_vocab_too_small_for_the_characters_names_the_size_needed(tmp_path):
  rc = tokenizer_cmd.main(
      ["train", "--input", str(TANG), "--vocab-size", "2000", "--output", str(tmp_path / "zh")]
  )
  assert rc == 1
  with pytest.raises(ValueError, match=r"vocab_size 2000 is too small .* --vocab-size >= 4000"):
    tok_lib.train_tokenizer(
        [str(TANG)], str(tmp_path / "zh"), tok_lib.TrainOptions(vocab_size=2000)
    )


def test_each_chinese_character_is_a_word_for_whole_word_masking(tmp_path):
  tok_lib.train_tokenizer([str(TANG)], str(tmp_path / "zh"), tok_lib.TrainOptions(vocab_size=4000))
  tok = tok_lib.SentencePieceTokenizer(tmp_path / "zh.model")
  ids = tok.encode("床前明月光，疑是地上霜。")
  pieces = [tok.id_to_piece(i) for i in ids]
  starts = [tok.is_word_start(i) for i in ids]
  # Every piece that begins with an ideograph starts a word (as google-research/bert splits
  # Chinese into characters), so whole-word masking never masks a whole line at once.
  assert all(s for p, s in zip(pieces, starts) if p.lstrip("\u2581")[:1] >= "\u4e00")
  assert sum(starts) >= 10
  assert not tok.is_word_start(tok.piece_to_id("。"))  # punctuation continues, as in English
