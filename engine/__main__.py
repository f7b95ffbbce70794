import os
import sys

# Before torch loads OpenMP: its threads sleep at a barrier instead of spinning. Spinning, two torch threads made a
# lone step 3.8-7.4x slower than one on this 2-core machine while anything else ran beside it; sleeping, 0.65-1.12x
# (docs/engine.md, "Two threads, and why they were ten times slower"). A value set by hand is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from engine.cli import main  # noqa: E402

sys.exit(main())
