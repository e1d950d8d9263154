"""SQuAD v1.1/v2.0 fine-tuning: reader (`data`), features with doc stride (`features`), n-best
span decoding (`decode`), the official EM/F1 (`evaluate`) and the loop (`train`)."""
