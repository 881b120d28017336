"""The ``gpufeed`` command line: parsing and printing only; the work lives in the library."""
