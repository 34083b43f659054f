"""The spectune operator: reconciles SpecDeployments and tunes their speculation threshold."""
