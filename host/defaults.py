"""Defaults the command line shows in its help and the commands use when called without it: kept
apart from the commands so that ``flashlm --help`` loads none of them."""

DEFAULT_PROMPT = "Once upon a time"
DEFAULT_BATCH = 4   # tokens per forward pass convert records: prefill chunks, speculative verification
MAX_DRAFTS = 7      # plan --roofline quotes speculation for 1..7 drafts a verification (as the batch allows)
# the KV cache formats and convert's default, for the help text without loading the converter (numpy):
# converter/formats.py KV_CODE and KV_DEFAULT say the same (tests/test_k12.py checks)
KV_FORMATS = ("f32", "int8", "k12")
KV_DEFAULT = "k12"
