"""Weakly supervised semantic segmentation with centered self-attention.

Importing the package turns off albumentations' update check, which asks PyPI for its latest version on import, in
every process that imports it: on an offline node that is a failed DNS lookup per process, and a timeout where
DNS hangs. The package reaches the network only when asked to download: the datasets (tools/prepare_data.py) and
backbone weights named by ``model.pretrained``. A value of the variable the user set stays.
"""

import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
