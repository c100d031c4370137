"""The verdict's final window, named once.

A run's score is the mean of its metric over the last ``DEFAULT_WINDOW_FRAC`` of its logged steps
(``stats.final_window_scores``) unless the caller chooses another fraction. The statistics, the
verdict table (viz), the ``compare`` verb, the canned experiments and the Compare page all start
from this one value. The module imports nothing, so the CLI's parser and the experiments' listing
can read the default without loading pandas or scipy.
"""

DEFAULT_WINDOW_FRAC = 0.1  # the last 10 % of each run's logged steps
