"""TensorRT-LLM rebuild drills, engine manifests and staleness."""
