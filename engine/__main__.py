import os
import sys

# Before torch loads OpenMP (libgomp reads both once, as it loads; a value set by hand is kept): its threads wait at
# a barrier by polling 10,000 times, then sleep, instead of spinning for good. Spinning, two torch threads made a
# lone step 3.8-7.4x slower than one on a 2-core machine while anything else ran beside it ("Two threads, and why
# they were ten times slower"); sleeping at once, every product of a step waits for the second thread's wake-up. The
# short poll catches the step's next product and lets the thread sleep between steps; where a neighbour makes two
# threads slower anyway, the thread tuner (engine/serving/threads.py) measures it and runs one (docs/engine.md,
# "The second thread's wait, on a machine where it pays").
from engine.launch import OPENMP_WAIT  # noqa: E402 (torch-free)

for _var, _value in OPENMP_WAIT.items():
    os.environ.setdefault(_var, _value)

from engine.cli import main  # noqa: E402

sys.exit(main())
