"""Torch-free locators of model weights shipped as pip packages: the default SmolLM2 GGUF,
and the larger GGUFs split over several packages (tests, benchmarks, ``make models-large``)."""
