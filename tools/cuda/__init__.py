"""Developer tools (not installed): see the README's developer-tools list."""
