export const notDefault = 1;
