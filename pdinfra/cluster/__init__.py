"""The cluster layer: the one schema of every inventory variable (schema), hardware profiles (profiles), the
resolved model (model), inventory -> model (resolve, inventory), model geometry (kvshape), SLOs (slo) and in-place
inventory edits (edit, for `pdinfra advise --apply`).
Nothing here imports a later layer."""
