"""The cluster layer: the one schema of every inventory variable (schema), hardware profiles (profiles), the
resolved model (model), inventory -> model (resolve, inventory), model geometry (kvshape) and SLOs (slo).
Nothing here imports a later layer."""
