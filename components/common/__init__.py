"""Code shared by every component: defaults, storage (local and gs://) and the dataset format."""
