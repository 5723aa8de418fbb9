"""The trainer torchrun runs on every rank: recipe -> model, adapter, data, HF Trainer, health checks."""
