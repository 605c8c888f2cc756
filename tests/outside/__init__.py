"""Code that lives outside `src/`, as a third party's would: it may use only stead's public tiers."""
