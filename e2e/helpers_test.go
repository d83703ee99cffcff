package e2e

import "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

func harnessSetDisplayName(obj *unstructured.Unstructured, name string) error {
	return unstructured.SetNestedField(obj.Object, name, "spec", "displayName")
}
