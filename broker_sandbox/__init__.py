"""The mocked clouds: AWS EC2 (moto behind a front that adds what moto lacks), GCP Compute and
Cloud Billing, Azure Resource Manager and Retail Prices, each an HTTP server on 127.0.0.1 that
speaks the real API's paths, shapes and error codes, so the real SDKs talk to them unchanged.

The test suite runs the broker against them (``tests/clouds`` imports these modules), and
``broker sandbox`` starts them with a broker configured against them, so a laptop with no cloud
account can quote, launch, hand off, watch and release. Install with the ``sandbox`` extra
(``pip install -e '.[sandbox]'``): moto and flask serve the fake EC2.
"""
