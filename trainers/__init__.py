"""Trainers (GRPO family, multi-policy). Not implemented yet; see DESIGN.md."""
