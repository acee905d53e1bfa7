"""accuracy_cases (factories named as 'accuracy_cases:...') must be importable."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
