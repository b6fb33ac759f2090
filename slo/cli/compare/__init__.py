"""`slo compare`: runs the engine once per serving technique and sets the ratios beside the
industry's claims (`command` runs, `matrix` is the pure table and report)."""
