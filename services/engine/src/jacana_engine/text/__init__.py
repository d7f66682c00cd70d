"""Text in and out: tokenizer, chat template, incremental detokenizer, stop strings."""
