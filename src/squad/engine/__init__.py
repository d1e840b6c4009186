"""Everything between squad and the llama-server process: binary, models, launcher, attach."""
