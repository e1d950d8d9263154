"""NER: the CoNLL reader, entity-level F1 (IOB1/IOB2), first-subword features, fine-tuning."""

import json
import os
import random

import numpy as np
import pytest

from bertjax.tasks.ner import conll, features, metrics

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKENIZER = os.path.join(REPO, "data", "tokenizer.model")
FIXTURES = os.path.join(REPO, "tests", "fixtures", "ner")


def test_reader_docstart_blank_lines_and_malformed_lines():
  s = conll.read(os.path.join(FIXTURES, "train.txt"))
  assert s.tokens == [
      ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
      ["Peter", "Blackburn", "BRUSSELS", "1996-08-22"],
      ["The", "European", "Commission", "on", "Thursday"],
  ]
  assert s.tags[1] == ["B-PER", "I-PER", "B-LOC", "O"]
  assert s.skipped == [
      "train.txt:15: one column 'brokenline'; expected 'TOKEN ... TAG'",
      "train.txt:24: tag 'BAD-TAG' is not O or B-/I-/E-/S-TYPE",
  ]
  assert conll.label_list(s) == ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-ORG", "I-PER"]
  with pytest.raises(conll.ConllError, match="missing.txt: no such file"):
    conll.read(os.path.join(FIXTURES, "missing.txt"))


def test_a_file_without_sentences_names_its_first_bad_line(tmp_path):
  path = tmp_path / "train.txt"
  path.write_text("-DOCSTART- -X- O\n\nEU\nJohn PER\n")
  want = r"train.txt: no sentences \(2 bad lines; first: train.txt:3: one column 'EU'"
  with pytest.raises(conll.ConllError, match=want):
    conll.read(str(path))
  path.write_text("-DOCSTART- -X- O\n\n")
  with pytest.raises(conll.ConllError, match="train.txt: no sentences — expected 'TOKEN ... TAG'"):
    conll.read(str(path))


def test_entities_iob1_and_iob2():
  iob1 = conll.read(os.path.join(FIXTURES, "iob1.txt")).tags
  assert metrics.entities(iob1) == {("PER", 0, 1), ("PER", 2, 2), ("ORG", 4, 5), ("LOC", 7, 7)}
  iob2 = [["B-PER", "I-PER", "B-PER", "O", "B-ORG", "I-ORG", "O", "B-LOC"]]
  assert metrics.entities(iob2) == metrics.entities(iob1)
  # A type change ends an entity; a sentence break ends one too.
  assert metrics.entities([["B-PER", "I-LOC"]]) == {("PER", 0, 0), ("LOC", 1, 1)}
  assert metrics.entities([["B-PER"], ["I-PER"]]) == {("PER", 0, 0), ("PER", 2, 2)}


def test_entity_f1_hand_computed():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  pred = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-MISC"]]
  # gold PER(0-1) LOC(3) ORG(5); pred PER(0) LOC(3) ORG(5) MISC(6): 2 right of 4 predicted, 3 gold.
  got = metrics.score(gold, pred)
  assert got["precision"] == pytest.approx(2 / 4) and got["recall"] == pytest.approx(2 / 3)
  assert got["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
  assert got["f1_PER"] == 0.0 and got["f1_LOC"] == 1.0 and got["f1_MISC"] == 0.0
  assert got["accuracy"] == pytest.approx(4 / 6)
  all_o = [["O"] * len(s) for s in gold]
  assert metrics.score(gold, all_o)["f1"] == 0.0
  assert metrics.score(gold, gold)["f1"] == 1.0
  with pytest.raises(ValueError, match="differ in length"):
    metrics.score(gold, [["O"]])


def test_first_subword_labels_and_long_sentences_split_at_words():
  from bertjax.data.tokenizer import SentencePieceTokenizer

  tok = SentencePieceTokenizer(TOKENIZER)
  s = conll.read(os.path.join(FIXTURES, "train.txt"))
  labels = conll.label_list(s)
  feats = features.build(tok, s, labels, max_seq_len=8)
  assert len(feats) > len(s)  # long sentences took several rows
  lab = feats.arrays["labels"]
  assert ((lab >= 0).sum(1) == [len(p) for p in feats.word_pos]).all()  # one label per word
  for r in range(len(feats)):
    ids = feats.arrays["input_ids"][r]
    for k, pos in enumerate(feats.word_pos[r]):
      sent, w = feats.sentence_N[r], feats.first_word_N[r] + k
      assert labels[lab[r, pos]] == s.tags[sent][w]
      assert ids[pos] == tok.encode(s.tokens[sent][w])[0]  # the word's first piece
  # Reading the gold labels back through word_tags gives the gold tags of every word.
  assert features.word_tags(feats, s, np.maximum(lab, 0), labels) == s.tags


_NAMES = "elizabeth jane lydia charlotte".split()
_SURNAMES = "darcy bingley collins".split()
_PLACES = "london derbyshire kent bath brighton".split()
_WORDS = "the a of and to in was is that it her his he she had for with as not be".split()


def _tagged_file(path, n, seed):
  """Sentences whose tags follow from word identity: a first name (B-PER), optionally followed
  by a surname (I-PER), a place (B-LOC), everything else O."""
  r = random.Random(seed)
  with open(path, "w") as f:
    f.write("-DOCSTART- O\n\n")
    for _ in range(n):
      words = []
      for _ in range(r.randint(4, 9)):
        u = r.random()
        if u < 0.2:
          words.append((r.choice(_NAMES), "B-PER"))
          if r.random() < 0.5:
            words.append((r.choice(_SURNAMES), "I-PER"))
        elif u < 0.35:
          words.append((r.choice(_PLACES), "B-LOC"))
        else:
          words.append((r.choice(_WORDS), "O"))
      f.write("".join(f"{w} {t}\n" for w, t in words) + "\n")


@pytest.mark.slow
def test_finetune_beats_all_o(tmp_path):
  from bertjax.commands import ner

  for name, n, seed in (("train", 256, 0), ("dev", 48, 1), ("test", 32, 2)):
    _tagged_file(tmp_path / f"{name}.txt", n, seed)
  out = tmp_path / "out"
  rc = ner.main(
      [
          "--init",
          "random",
          "--tokenizer",
          TOKENIZER,
          "--train",
          str(tmp_path / "train.txt"),
          "--dev",
          str(tmp_path / "dev.txt"),
          "--test",
          str(tmp_path / "test.txt"),
          "--workdir",
          str(out),
          "--max-seq-len",
          "24",
          "--epochs",
          "3",
          "--batch-size",
          "16",
          "--learning-rate",
          "1e-3",
          "--dropout",
          "0.0",
          "--eval-untrained",
          "--no-progress",
      ]
  )
  assert rc == 0
  results = json.loads((out / "results.json").read_text())
  gold = conll.read(str(tmp_path / "dev.txt")).tags
  all_o = metrics.score(gold, [["O"] * len(s) for s in gold])["f1"]
  assert all_o == 0.0
  assert results["dev"]["f1"] > max(0.7, results["untrained"]["f1"]), results
  assert results["test"]["f1"] > 0.7, results
  lines = (out / "test_predictions.txt").read_text().splitlines()
  assert len(lines[0].split()) == 3  # TOKEN GOLD PREDICTED
  assert json.loads((out / "best.json").read_text())["labels"] == ["O", "B-LOC", "B-PER", "I-PER"]
