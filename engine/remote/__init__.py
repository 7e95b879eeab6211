"""The remote engine: echoline's prompts and stop rules, a shared inference server's forward passes."""
