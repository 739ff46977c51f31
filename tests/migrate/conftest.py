def pytest_addoption(parser):
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite fixtures/migrate/*.out.py (and *.unsafe.out.py) from the current rewrites",
    )
