"""What comes from outside and how it is checked: safetensors checkpoints and their configs, WAV audio
and resampling, model names and the Hugging Face cache, atomic file writes, the config and input
validators. No network math lives here; everything above reads its files through this layer."""
