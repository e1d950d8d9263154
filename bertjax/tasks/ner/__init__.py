"""Token classification (NER): CoNLL-2003 reader (`conll`), first-subword features
(`features`), seqeval-style entity F1 (`metrics`) and the loop (`train`)."""
