"""Helpers shared by the notebooks of the course on efficient PyTorch training.

One module per idea a learner meets:

- ``data``: the offline paraphrase dataset, its tokenizer and DataLoaders (lesson 1)
- ``models``: the tiny pre-trained checkpoint and full-size architectures (lessons 1-3)
- ``loops``: the plain PyTorch loop and the same loop with Accelerate (lesson 1)
- ``memory``: optimizer-state and training-memory estimates and measurements (lessons 2-3)
- ``plots``: the figures the lessons draw
- ``exercises``: the check / hint / solution machinery behind every exercise
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
DATA_DIR = REPO_DIR / "data"
