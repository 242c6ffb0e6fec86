"""Worked examples: custom models and data for Gearshift, named by import path from the repository root
(e.g. model.name = "examples.mlp:build")."""
