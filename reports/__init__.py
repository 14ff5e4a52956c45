"""The result model and its renderings (ConformanceReport YAML, HTML, JUnit, Allure)."""
