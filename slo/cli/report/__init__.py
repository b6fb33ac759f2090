"""`slo report` and the verdict formats `slo check` writes: the front ends that draw a run."""
