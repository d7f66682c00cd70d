"""Jacana's speech-to-text service: Whisper run in torch on CTranslate2 checkpoints."""
