// Package validate checks the Kubernetes manifests beside it against the
// Kubernetes API's own Go types (k8s.io/api), the types the OpenAPI schema
// is generated from: every document decodes strictly (an unknown or
// misspelt field fails), then the settings gdsfs depends on are asserted.
// It is a module of its own so that gdsfs itself does not depend on
// k8s.io/api; `make test` runs it.
package validate
