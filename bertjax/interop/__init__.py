"""Other BERTs in and out: Hugging Face (`convert.py`) and google-research/bert (`google_ckpt.py`)."""
