"""The web dashboard (`sluice ui`): a Starlette app serving the views as JSON and
pages built from the package's own static assets (nothing from a CDN)."""
