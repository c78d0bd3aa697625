package kubelet

import (
	"bytes"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// DecodeDRAMetadata reads a device metadata file (KEP-5304) as a workload would, with the
// upstream package (k8s.io/dynamic-resource-allocation/devicemetadata at the pinned release): the
// stream must hold exactly a v1beta1 DeviceMetadata, then a v1alpha1 one, each valid by the
// upstream validation. The error says which object is wrong and how.
func DecodeDRAMetadata(data []byte) (*metadatav1beta1.DeviceMetadata, *metadatav1alpha1.DeviceMetadata, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var beta metadatav1beta1.DeviceMetadata
	var alpha metadatav1alpha1.DeviceMetadata
	want := []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion, metadatav1alpha1.SchemeGroupVersion}
	for i, obj := range []runtime.Object{&beta, &alpha} {
		var invalid error
		var gvk schema.GroupVersionKind
		if err := devicemetadata.DecodeMetadataFromStream(dec, obj,
			devicemetadata.DecodeMetadataWithValidationResult(&invalid), devicemetadata.DecodeMetadataStoreGVKResult(&gvk)); err != nil {
			return nil, nil, fmt.Errorf("object %d: %w", i, err)
		}
		if invalid != nil {
			return nil, nil, fmt.Errorf("object %d is not valid: %w", i, invalid)
		}
		if gvk.GroupVersion() != want[i] || gvk.Kind != "DeviceMetadata" {
			return nil, nil, fmt.Errorf("object %d is %v, want %v DeviceMetadata", i, gvk, want[i])
		}
	}
	if dec.More() {
		return nil, nil, fmt.Errorf("more than two objects")
	}
	return &beta, &alpha, nil
}
