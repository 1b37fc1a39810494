"""Accelerator generations, slice types, zones and prices, as data with its source and date.

``Catalog.load()`` reads the bundled YAML files; ``catalog.resolve("v5e-64")`` gives an
``AcceleratorType`` (``v5litepod-64``, topology 8x8, 16 hosts of 4 chips). Everything here is plain data:
no network, no cloud SDK.
"""

from tpuctl.catalog.catalog import (
    POD_SKU_GENERATIONS,
    AcceleratorType,
    CapacityType,
    Catalog,
    ComputeQuota,
    ComputeShape,
    Generation,
    PriceTable,
    QuotaFamily,
    Surface,
    price_key,
    region_of_zone,
    validate_zone,
)

__all__ = [
    "POD_SKU_GENERATIONS",
    "AcceleratorType",
    "CapacityType",
    "Catalog",
    "ComputeQuota",
    "ComputeShape",
    "Generation",
    "PriceTable",
    "QuotaFamily",
    "Surface",
    "price_key",
    "region_of_zone",
    "validate_zone",
]
